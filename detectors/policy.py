"""Recovery policy: for an incident, the action with the lowest expected cost.

    >>> from detectors.policy import Facts, decide
    >>> d = decide(Facts(kind="straggler", ranks=(6,), slower_frac=0.03, horizon_s=36_000,
    ...                  since_checkpoint_s=60, world_size=512, allow_evict=True))
    >>> d.action, d.target_ranks, d.params
    ('evict_rank', None, {'ranks': [6]})
    >>> import textwrap; print(textwrap.fill(d.explanation, 88))
    evict_rank (est. 4.2 min) rather than nothing (est. 18 min): a 3.0% slower rank 6 over
    10 h left costs ~18 min; evicting rank 6 costs ~4.2 min: ~2 min restart + ~60 s redone
    since the checkpoint + ~70 s of lost capacity (511 of 512 ranks left)
    >>> [(c.action, round(c.cost_s)) for c in d.candidates]
    [('evict_rank', 250), ('restart', 720), (None, 1080)]

Every cost is an *estimate* of job time lost, in seconds, over the remaining ``horizon_s``
of training: what each choice costs, not what it saves. The model is deliberately simple,
so that a person reading the reasoning can check it:

- ``R`` seconds to restart the group (``restart_s``), ``L`` seconds of work since the last
  checkpoint, redone after any restart or rollback (``since_checkpoint_s``).
- slow kinds (straggler, slowdown, comm_anomaly), slower by ``f``: doing nothing costs
  ``f * H``; restart ``R + L + persist_p * f * H`` (torchrun restarts on the same nodes, so
  the slowness may stay); evicting ``k`` of ``W`` ranks ``R + L + H * k / (W - k)`` (the
  capacity lost). ``dump_stacks`` changes nothing but collects evidence for a person.
- hang and crash: doing nothing leaves the job down until a person restarts it by hand,
  ``P + R + L`` (``respond_s``, 30 min: the job never finishes on its own, however little
  of it is left, so the restart and the lost work are paid anyway, only later); restart
  ``R + L``.
- nan and loss_spike: doing nothing costs ``failure_p * (H + P + R + L)`` (training
  diverges: the rest of the run is wasted, and a person rolls it back later anyway, however
  little of it was left: a diverged model is no result); rollback to the last good
  checkpoint ``R + L``.
- memory_pressure: doing nothing costs ``failure_p * (R + L)`` (an out-of-memory crash);
  ``checkpoint_now`` costs ``checkpoint_s + failure_p * R``.
- A condition that already cleared (``active=False``, e.g. a transient straggler) costs
  nothing more; acting on it only costs.

Disruptive actions (restart, evict_rank, rollback) must beat the best non-disruptive
choice by ``min_gain_s``: the numbers are rough, and a restart is not free of risk.
Only ``restart`` and ``dump_stacks`` have built-in handlers on ranks; ``evict_rank``,
``rollback`` and ``checkpoint_now`` need ``@vigil.on_action`` handlers in the job.

``apply_swap_policy`` is a default candidate of ``opseq_change`` and ``memory_pressure``
(so a policy's ``actions`` list can allow or refuse it) but is not costed here: the swap
loop (``backend.swap.loop``) sends it beside this choice, with the activation-swap policy
for the job's op sequence, where ranks run the swap executor. It is not disruptive.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_CANDIDATES",
    "Candidate",
    "Decision",
    "Facts",
    "decide",
    "facts_dict",
    "facts_from_incident",
    "failure_probability",
    "human_seconds",
    "slower_fraction",
]

DEFAULT_HORIZON_S = 4 * 3600.0
DEFAULT_RESTART_S = 120.0
DEFAULT_CHECKPOINT_S = 30.0
DEFAULT_PERSIST_P = 0.5
DEFAULT_MIN_GAIN_S = 300.0
DEFAULT_RESPOND_S = 1800.0  # until a person on call notices a down job and restarts it

DEFAULT_CANDIDATES: dict[str, tuple[str, ...]] = {
    "straggler": ("evict_rank", "restart"),
    "hang": ("restart", "dump_stacks"),
    "crash": ("restart",),
    "nan": ("rollback",),
    "loss_spike": ("rollback",),
    "slowdown": ("dump_stacks",),
    "comm_anomaly": ("dump_stacks",),
    "memory_pressure": ("checkpoint_now", "apply_swap_policy"),
    "opseq_change": ("apply_swap_policy",),
    "slo_burn": (),
}
SWAP_LOOP_NOTE = (
    "sent by the swap loop, beside this choice, with the policy for the job's op sequence "
    "(where ranks run the swap executor)"
)
DISRUPTIVE = frozenset({"restart", "exit_for_restart", "evict_rank", "rollback"})
SLOW_KINDS = frozenset({"straggler", "slowdown", "comm_anomaly"})
DOWN_KINDS = frozenset({"hang", "crash"})
DIVERGE_KINDS = frozenset({"nan", "loss_spike"})
# On equal cost: evidence first, then the least disruptive.
_PREFERENCE = ("dump_stacks", None, "checkpoint_now", "rollback", "restart", "evict_rank")


@dataclass(frozen=True)
class Facts:
    """What the policy knows about one incident. Times in seconds; fractions in 0..1.

    slower_frac: how much slower the job runs (0.03: 3%), for the slow kinds.
    failure_p: chance the condition turns into a failure within the horizon (nan: 1).
    since_checkpoint_s: work since the last checkpoint, lost by a restart or rollback.
    allowed: the actions the job's policy allows; None means the kind's defaults.
    """

    kind: str
    ranks: tuple[int, ...] = ()
    active: bool = True
    slower_frac: float = 0.0
    failure_p: float = 1.0
    step_s: float | None = None
    horizon_s: float = DEFAULT_HORIZON_S
    # False: horizon_s is what is left of the run's planned length; True: an assumption
    # (the policy's horizon_s or DEFAULT_HORIZON_S), which every estimate then says.
    horizon_assumed: bool = False
    horizon_note: str = ""  # where horizon_s came from, for the reasoning record
    since_checkpoint_s: float = 0.0
    restart_s: float = DEFAULT_RESTART_S
    checkpoint_s: float = DEFAULT_CHECKPOINT_S
    world_size: int = 1
    allow_evict: bool = False
    persist_p: float = DEFAULT_PERSIST_P
    min_gain_s: float = DEFAULT_MIN_GAIN_S
    respond_s: float = DEFAULT_RESPOND_S
    allowed: tuple[str, ...] | None = None
    first_step: int | None = None


@dataclass(frozen=True)
class Candidate:
    """One choice with its estimated cost; ``action=None`` is doing nothing."""

    action: str | None
    cost_s: float
    explanation: str
    target_ranks: tuple[int, ...] | None = None
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    action: str | None
    target_ranks: tuple[int, ...] | None
    params: dict[str, Any]
    explanation: str
    candidates: tuple[Candidate, ...]
    skipped: tuple[tuple[str, str], ...] = ()
    horizon: str = ""  # Facts.horizon_note: how long the job was taken to run on

    def to_dict(self) -> dict[str, Any]:
        """JSON-able reasoning: the cost table, what was skipped and why, the choice."""
        return {
            "estimate": "expected job time lost over the horizon, in seconds (rough estimates)",
            "chosen": self.action,
            "explanation": self.explanation,
            "horizon": self.horizon,
            "candidates": [
                {
                    "action": c.action,
                    "cost_s": round(c.cost_s, 1) if math.isfinite(c.cost_s) else None,
                    "explanation": c.explanation,
                    "chosen": c.action == self.action,
                }
                for c in self.candidates
            ],
            "skipped": [{"action": a, "why": why} for a, why in self.skipped],
        }


def human_seconds(seconds: float) -> str:
    """``45 s``, ``18 min``, ``3.2 h``, ``6.5 days``: about two significant digits, since
    these are estimates (never exponent notation: ``140 h`` reads as ``5.8 days``)."""
    if not math.isfinite(seconds):
        return "unbounded"
    if seconds < 90:
        return f"{seconds:.0f} s"
    for unit, size, limit in (("min", 60, 90), ("h", 3600, 48), ("days", 86_400, math.inf)):
        value = seconds / size
        if value < limit:
            shown = f"{value:.1f}".removesuffix(".0") if value < 10 else f"{value:.0f}"
            return f"{shown} {unit}"
    raise AssertionError("unreachable")


def _ranks(ranks: tuple[int, ...]) -> str:
    if not ranks:
        return "the job"
    shown = ", ".join(str(r) for r in ranks[:5]) + (", …" if len(ranks) > 5 else "")
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}"


def decide(facts: Facts) -> Decision:
    """Cost every allowed candidate for ``facts`` and choose the cheapest (see module doc)."""
    f = facts
    h = human_seconds
    wanted = f.allowed if f.allowed is not None else DEFAULT_CANDIDATES.get(f.kind, ())
    skipped: list[tuple[str, str]] = []
    if f.allowed is not None:
        defaults = DEFAULT_CANDIDATES.get(f.kind, ())
        skipped += [(a, "not allowed by the policy") for a in defaults if a not in f.allowed]
    nothing = _nothing(f)
    costed: list[Candidate] = [nothing]
    for action in dict.fromkeys(wanted):
        cand = _candidate(f, action, nothing.cost_s)
        if isinstance(cand, str):
            skipped.append((action, cand))
        else:
            costed.append(cand)
    costed.sort(key=lambda c: (c.cost_s, _rank_of(c.action)))
    calm = [c for c in costed if c.action not in DISRUPTIVE]
    best_calm = calm[0]
    best = costed[0]
    note = ""
    if best.action in DISRUPTIVE and best_calm.cost_s - best.cost_s < f.min_gain_s:
        note = (
            f"; {best.action} would save only ~{h(best_calm.cost_s - best.cost_s)}, "
            f"less than min_gain_s ({h(f.min_gain_s)})"
        )
        best = best_calm
    if best.action is None:
        explanation = f"no action: {nothing.explanation}{note}"
    elif best.action == "dump_stacks" and best.cost_s >= nothing.cost_s:
        explanation = f"dump_stacks for evidence; no recovery action pays: {nothing.explanation}"
    else:
        explanation = (
            f"{best.action} (est. {h(best.cost_s)}) rather than nothing "
            f"(est. {h(nothing.cost_s)}): {nothing.explanation}; {best.explanation}"
        )
    return Decision(
        action=best.action,
        target_ranks=best.target_ranks,
        params=dict(best.params),
        explanation=explanation,
        candidates=tuple(costed),
        skipped=tuple(skipped),
        horizon=f.horizon_note,
    )


def _rank_of(action: str | None) -> int:
    return _PREFERENCE.index(action) if action in _PREFERENCE else len(_PREFERENCE)


def _left(f: Facts) -> str:
    """``10 h`` left of a planned run, or ``an assumed 4 h`` when its length is unknown."""
    return f"{'an assumed ' if f.horizon_assumed else ''}{human_seconds(f.horizon_s)}"


def _nothing(f: Facts) -> Candidate:
    h = human_seconds
    if not f.active:
        return Candidate(None, 0.0, f"the {f.kind} already cleared; nothing more to lose")
    if f.kind in SLOW_KINDS:
        cost = f.slower_frac * f.horizon_s
        who = f"{_ranks(f.ranks)} " if f.kind == "straggler" else "job "
        return Candidate(
            None,
            cost,
            f"a {100 * f.slower_frac:.1f}% slower {who}over {_left(f)} left costs ~{h(cost)}",
        )
    if f.kind in DOWN_KINDS:
        cost = f.respond_s + f.restart_s + f.since_checkpoint_s
        return Candidate(
            None,
            cost,
            f"a {f.kind} never finishes on its own: the job is down until a person restarts it "
            f"(assumed {h(f.respond_s)}), then pays the restart and the "
            f"{h(f.since_checkpoint_s)} of work since the checkpoint anyway",
        )
    if f.kind in DIVERGE_KINDS:
        cost = f.failure_p * (f.horizon_s + f.respond_s + f.restart_s + f.since_checkpoint_s)
        return Candidate(
            None,
            cost,
            f"if training diverges (estimated chance {f.failure_p:.0%}), the rest of the run "
            f"({_left(f)}) is wasted and a person rolls it back later anyway "
            f"(assumed {h(f.respond_s)} to notice): ~{h(cost)}",
        )
    if f.kind == "memory_pressure":
        cost = f.failure_p * (f.restart_s + f.since_checkpoint_s)
        return Candidate(
            None,
            cost,
            f"running out of memory (estimated chance {f.failure_p:.0%}) costs a restart "
            f"and {h(f.since_checkpoint_s)} of work since the checkpoint: ~{h(cost)}",
        )
    return Candidate(None, 0.0, f"no recovery action applies to {f.kind}")


def _candidate(f: Facts, action: str, nothing_s: float) -> Candidate | str:
    """The costed candidate, or why it does not apply."""
    h = human_seconds
    base = f.restart_s + f.since_checkpoint_s
    redo = f"~{h(f.restart_s)} restart + ~{h(f.since_checkpoint_s)} redone since the checkpoint"
    if action == "dump_stacks":
        if not f.active:
            return "the condition already cleared: stacks would show nothing"
        return Candidate(
            action,
            nothing_s,
            "dump_stacks changes nothing by itself (~1 s on a side thread); "
            "it gives a person the evidence",
            tuple(f.ranks) or None,
        )
    if action in ("restart", "exit_for_restart"):
        if f.kind in DIVERGE_KINDS:
            return "a restart resumes from the latest checkpoint, which may hold the bad state"
        extra, why = 0.0, ""
        if f.kind in SLOW_KINDS and f.active:
            extra = f.persist_p * f.slower_frac * f.horizon_s
            why = f" + {f.persist_p:.0%} chance the slowness stays on the same nodes (~{h(extra)})"
        return Candidate(
            action, base + extra, f"restarting costs ~{h(base + extra)}: {redo}{why}", None
        )
    if action == "evict_rank":
        if not f.allow_evict:
            return "eviction is off for this job (params.allow_evict)"
        k = len(f.ranks)
        if k == 0 or k >= f.world_size:
            return f"needs culprit ranks and a smaller group than {f.world_size} ranks"
        capacity = f.horizon_s * k / (f.world_size - k)
        cost = base + capacity
        return Candidate(
            action,
            cost,
            f"evicting {_ranks(f.ranks)} costs ~{h(cost)}: {redo} + ~{h(capacity)} of lost "
            f"capacity ({f.world_size - k} of {f.world_size} ranks left)",
            None,
            {"ranks": list(f.ranks)},
        )
    if action == "rollback":
        if f.kind not in DIVERGE_KINDS:
            return f"rolling back does not help a {f.kind}"
        params: dict[str, Any] = {}
        if f.first_step is not None:
            # The first bad loss is at first_step; the update before it may already have
            # poisoned the weights, so checkpoints from first_step - 1 on are suspect.
            params["before_step"] = max(0, f.first_step - 1)
        why = f"rolling back to the last good checkpoint costs ~{h(base)}: {redo}"
        return Candidate(action, base, why, None, params)
    if action == "checkpoint_now":
        if f.kind != "memory_pressure":
            return f"a checkpoint does not help a {f.kind}"
        cost = f.checkpoint_s + f.failure_p * f.restart_s
        return Candidate(
            action,
            cost,
            f"checkpointing now costs ~{h(f.checkpoint_s)} and leaves only the restart at "
            f"risk: ~{h(cost)}",
        )
    if action == "apply_swap_policy":
        return SWAP_LOOP_NOTE
    return f"no cost model for {action} on a {f.kind}"


def _num(evidence: Mapping[str, Any], key: str) -> float | None:
    value = evidence.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def slower_fraction(kind: str, evidence: Mapping[str, Any], step_s: float | None) -> float:
    """How much slower the job runs because of the incident (0.03: 3%); 0 when unknown.

    A straggler sets the pace of synchronous training: its extra compute ``d`` per step is
    the job's extra step time, so the job is ``d / (step - d)`` slower.
    """
    if kind == "straggler":
        rank, median = _num(evidence, "rank_compute_s"), _num(evidence, "median_compute_s")
        if rank is not None and median is not None and step_s and step_s > rank - median > 0:
            return (rank - median) / (step_s - (rank - median))
        ratio = _num(evidence, "ratio")
        return max(0.0, ratio - 1.0) if ratio is not None else 0.0
    if kind == "slowdown":
        rise = _num(evidence, "rise_pct")
        return max(0.0, rise / 100) if rise is not None else 0.0
    return 0.0


def failure_probability(
    kind: str, evidence: Mapping[str, Any], step_s: float | None, horizon_s: float
) -> float:
    """Chance the incident turns into a failure within the horizon (rough priors)."""
    if kind == "nan":
        return 1.0
    if kind == "loss_spike":
        return 0.25  # most spikes recover on their own; some are the start of divergence
    if kind == "memory_pressure":
        steps = _num(evidence, "steps_to_capacity")
        if steps is None or not step_s:
            return 0.5
        return 0.9 if steps * step_s <= horizon_s else 0.1
    return 1.0


def facts_from_incident(
    *,
    kind: str,
    ranks: tuple[int, ...],
    active: bool,
    evidence: Mapping[str, Any],
    params: Mapping[str, Any],
    step_s: float | None,
    since_checkpoint_s: float,
    world_size: int,
    allowed: tuple[str, ...] | None = None,
    first_step: int | None = None,
    remaining_s: float | None = None,
    plan_note: str = "",
) -> Facts:
    """Facts from an incident's fields and a policy's ``params`` (defaults where absent).

    The horizon is what is left of the run when its planned length is known
    (``remaining_s``, with ``plan_note`` saying how it was worked out); otherwise an
    assumption, the policy's ``horizon_s`` or ``DEFAULT_HORIZON_S``, and the estimates say
    "assumed".

    >>> facts_from_incident(kind="slowdown", ranks=(), active=True, evidence={"rise_pct": 20},
    ...     params={"horizon_s": 3600}, step_s=1.0, since_checkpoint_s=0, world_size=8
    ... ).slower_frac
    0.2
    """
    horizon, assumed, note = _horizon(params, remaining_s, plan_note)
    return Facts(
        kind=kind,
        ranks=tuple(ranks),
        active=active,
        slower_frac=slower_fraction(kind, evidence, step_s),
        failure_p=failure_probability(kind, evidence, step_s, horizon),
        step_s=step_s,
        horizon_s=horizon,
        horizon_assumed=assumed,
        horizon_note=note,
        since_checkpoint_s=max(0.0, since_checkpoint_s),
        restart_s=float(params.get("restart_s", DEFAULT_RESTART_S)),
        checkpoint_s=float(params.get("checkpoint_s", DEFAULT_CHECKPOINT_S)),
        world_size=max(1, world_size),
        allow_evict=bool(params.get("allow_evict", False)),
        persist_p=float(params.get("persist_p", DEFAULT_PERSIST_P)),
        min_gain_s=float(params.get("min_gain_s", DEFAULT_MIN_GAIN_S)),
        respond_s=float(params.get("respond_s", DEFAULT_RESPOND_S)),
        allowed=allowed,
        first_step=first_step,
    )


def _horizon(
    params: Mapping[str, Any], remaining_s: float | None, plan_note: str
) -> tuple[float, bool, str]:
    """``(horizon_s, assumed, note)``: the run's remaining time when known, else assumed."""
    if remaining_s is not None:
        left = max(0.0, float(remaining_s))
        return left, False, f"{human_seconds(left)} left of the run: {plan_note}".rstrip(": ")
    unknown = "the job's planned length is unknown (vigil.init(total_steps=…) or VIGIL_TOTAL_STEPS)"
    if "horizon_s" in params:
        horizon = float(params["horizon_s"])
        return (
            horizon,
            True,
            f"assumed {human_seconds(horizon)} left (the policy's horizon_s): {unknown}",
        )
    return (
        DEFAULT_HORIZON_S,
        True,
        f"assumed {human_seconds(DEFAULT_HORIZON_S)} left (the default horizon): {unknown}",
    )


def facts_dict(facts: Facts) -> dict[str, Any]:
    """The facts as JSON-able values, for the reasoning record."""
    out = asdict(facts)
    out["ranks"] = list(facts.ranks)
    out["allowed"] = list(facts.allowed) if facts.allowed is not None else None
    return out

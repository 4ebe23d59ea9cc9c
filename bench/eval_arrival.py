"""Findings that do not depend on the order batches arrive in (issue 15, item 2), measured.

A job's step records (:class:`bench.replay.Telemetry`) reach an in-process stand-in for the
server one batch at a time (one rank's flush of ``chunk`` steps, or a backlog of several);
a detection run after every few batches sees what has arrived as ``load_steps`` gives it,
cut to its settled steps (``detectors.settle.settled``, every rank live) with carried
baselines (:func:`bench.replay.replay`). The orders:

- ``in order``: every rank's batch of a flush, then a detection run (the reference);
- ``whole-rank bursts``: each rank loses the network for three flushes at a random time,
  then its backlog lands at once;
- ``slow ranks first``: at every flush the slow ranks' batches land first, one by one;
- ``round-robin, lagging``: ranks take turns, rank r ``r mod 3`` flushes behind;
- ``random delays``: every batch is late by an exponential delay (mean one flush, at most
  three), so a rank's own batches land out of order too.

Delays stay within ``detectors.settle.MAX_HOLD`` steps. The adversarial orders run a detection
after every batch (16 ranks, PAI's 10 workers) or every ``ranks / 8`` batches (1,024 ranks;
``--quick``: ``ranks / 2``). Findings are *equal* when the same ranks are named, each with as
many incidents (no episode re-opened: flapping), each onset within ``ONSET_TOLERANCE`` steps
of the in-order replay's. The in-order replay itself is checked against the truth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from bench.eval_real import in_order, pai_telemetry, straggler_case
from bench.replay import Batch, Outcome, Telemetry, replay
from bench.simulate import Fault, JobConfig, simulate

ONSET_TOLERANCE = 5  # steps between an order's onset and the in-order replay's
BURST_FLUSHES = 3  # a rank offline this many flushes, then its backlog at once
MAX_DELAY = 3.0  # flushes
Order = Callable[[Telemetry, np.random.Generator], Iterator[Batch]]

__all__ = ["ORDERS", "ArrivalCase", "Verdict", "compare", "eval_arrival", "simulated_job"]


def whole_rank_bursts(job: Telemetry, rng: np.random.Generator) -> Iterator[Batch]:
    n, ranks = job.n_chunks, job.n_ranks
    offline = rng.integers(1, max(2, n - BURST_FLUSHES), ranks)  # first flush lost
    sent = np.zeros(ranks, dtype=np.int64)
    for tick in range(n):
        for r in rng.permutation(ranks).tolist():
            if offline[r] <= tick < offline[r] + BURST_FLUSHES:
                continue
            yield (r, int(sent[r]), tick + 1)
            sent[r] = tick + 1
    for r in range(ranks):  # the network is back for everyone
        if sent[r] < n:
            yield (r, int(sent[r]), n)


def slow_ranks_first(job: Telemetry, rng: np.random.Generator) -> Iterator[Batch]:
    others = [r for r in range(job.n_ranks) if r not in job.truth]
    for c in range(job.n_chunks):
        for r in (*sorted(job.truth), *others):
            yield (r, c, c + 1)


def round_robin_lagging(job: Telemetry, rng: np.random.Generator) -> Iterator[Batch]:
    for tick in range(job.n_chunks + 2):
        for r in range(job.n_ranks):
            c = tick - r % 3  # up to two flushes behind
            if 0 <= c < job.n_chunks:
                yield (r, c, c + 1)


def random_delays(job: Telemetry, rng: np.random.Generator) -> Iterator[Batch]:
    n = job.n_chunks
    late = np.minimum(rng.exponential(1.0, (job.n_ranks, n)), MAX_DELAY)
    lands = (np.arange(n)[None, :] + late).ravel()
    for flat in np.argsort(lands, kind="stable").tolist():
        r, c = divmod(flat, n)
        yield (r, c, c + 1)


ORDERS: dict[str, Order] = {
    "whole-rank bursts": whole_rank_bursts,
    "slow ranks first": slow_ranks_first,
    "round-robin, lagging": round_robin_lagging,
    "random delays": random_delays,
}


@dataclass(frozen=True)
class Verdict:
    """One order against the in-order replay: ``problems`` empty when the findings equal."""

    order: str
    outcome: Outcome
    problems: tuple[str, ...]
    onset_shift: int  # largest |onset - in-order onset| over the ranks both named, in steps

    @property
    def equal(self) -> bool:
        return not self.problems


@dataclass
class ArrivalCase:
    job: Telemetry
    reference: Outcome
    truth_ok: bool
    truth_text: str
    verdicts: list[Verdict] = field(default_factory=list)


def compare(
    job: Telemetry, ref: Outcome, got: Outcome, *, tolerance: int = ONSET_TOLERANCE
) -> tuple[tuple[str, ...], int]:
    """(problems, largest onset shift) of ``got`` against the reference replay ``ref``."""
    problems = []
    if set(got.opened) != set(ref.opened):
        extra, missing = set(got.opened) - set(ref.opened), set(ref.opened) - set(got.opened)
        problems.append(f"named {_few(extra)} more, {_few(missing)} missing")
    shifts = [
        abs(job.position(got.onset(r)) - job.position(ref.onset(r)))
        for r in set(got.opened) & set(ref.opened)
    ]
    shift = max(shifts, default=0)
    if shift > tolerance:
        problems.append(f"onset moved by up to {shift} steps")
    if got.flaps > ref.flaps:
        problems.append(f"{got.flaps} incident(s) re-opened ({ref.flaps} in order)")
    return tuple(problems), shift


def _few(ranks: set[int], limit: int = 6) -> str:
    shown = sorted(ranks)
    text = ",".join(map(str, shown[:limit])) + ("…" if len(shown) > limit else "")
    return f"{len(shown)} [{text}]" if shown else "0"


def simulated_job(ranks: int, *, seed: int = 0, steps: int = 400, chunk: int = 10) -> Telemetry:
    """A simulated job whose random 3/8 of the ranks turn 1.25× slower at step 200 and stay
    so, as ``chunk``-step batches (the simulator's step ids)."""
    rng = np.random.default_rng([seed, ranks])
    cfg = JobConfig(ranks=ranks, steps=steps, seed=seed, step_s=0.5, jitter=0.02)
    group = np.sort(rng.choice(ranks, 3 * ranks // 8, replace=False))
    onset = min(200, steps // 2)
    run = simulate(cfg, [Fault("straggler", (int(r),), onset, magnitude=1.25) for r in group])
    return Telemetry(
        name=f"simulated, {ranks:,} ranks ({group.size} slow 1.25×)",
        steps=run.steps,
        step_time=run.step_time,
        comm_time=run.comm_time,
        chunk=chunk,
        truth=frozenset(int(r) for r in group),
        onset=int(run.steps[onset]),
    )


def evaluate(job: Telemetry, *, per_run: int, seed: int = 0) -> ArrivalCase:
    """The in-order replay against the truth, then every order against it."""
    ref = replay(job, in_order(job), per_run=job.n_ranks)
    truth = straggler_case(job.name, job, ref, ONSET_TOLERANCE)
    case = ArrivalCase(job=job, reference=ref, truth_ok=truth.ok, truth_text=truth.found)
    for i, (name, order) in enumerate(ORDERS.items()):
        got = replay(job, order(job, np.random.default_rng([seed, i])), per_run=per_run)
        problems, shift = compare(job, ref, got)
        case.verdicts.append(Verdict(name, got, problems, shift))
    return case


def eval_arrival(*, big_ranks: int | None, seed: int = 0) -> list[ArrivalCase]:
    """Simulated group stragglers at 16 (and ``big_ranks``) ranks, and PAI job_1 in
    5-sample batches."""
    cases = [evaluate(simulated_job(16, seed=seed), per_run=1, seed=seed)]
    if big_ranks:
        big = simulated_job(big_ranks, seed=seed, steps=300)
        cases.append(evaluate(big, per_run=big.n_ranks // 4, seed=seed))
    cases.append(evaluate(pai_telemetry(chunk=5), per_run=1, seed=seed))
    return cases


def report(cases: list[ArrivalCase]) -> list[tuple[str, bool]]:
    """Print each case's orders against its in-order replay; return the targets."""
    print("")
    print(
        "Arrival orders — findings of each order vs the in-order replay (same ranks, onsets "
        f"within {ONSET_TOLERANCE} steps, no incident re-opened):"
    )
    print(
        f"  {'job':<38}{'order':<22}{'runs':>6}{'held':>6}{'ms/run':>8}{'named':>7}"
        f"{'Δonset':>8}{'re-opened':>10}  verdict"
    )
    results = []
    for case in cases:
        job, ref = case.job, case.reference
        _row(job.name, "in order", ref, 0, "truth " + ("ok" if case.truth_ok else "WRONG"))
        for v in case.verdicts:
            _row(
                "", v.order, v.outcome, v.onset_shift, "equal" if v.equal else "; ".join(v.problems)
            )
        if not case.truth_ok:
            print(f"    in order named: {case.truth_text[:300]}")
        equal = sum(v.equal for v in case.verdicts)
        results.append(
            (f"arrival orders, {job.name}: in-order replay names the truth", case.truth_ok)
        )
        results.append(
            (
                f"arrival orders, {job.name}: findings equal in-order "
                f"({equal} of {len(case.verdicts)} orders)",
                equal == len(case.verdicts),
            )
        )
    return results


def _row(name: str, order: str, o: Outcome, shift: int, verdict: str) -> None:
    ms = 1e3 * o.seconds / o.runs if o.runs else float("nan")
    print(
        f"  {name:<38}{order:<22}{o.runs:>6}{o.held:>6}{ms:>8.1f}{len(o.opened):>7}"
        f"{shift:>8}{o.flaps:>10}  {verdict}"
    )

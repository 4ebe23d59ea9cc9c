"""Hangs and crashes from each rank's latest state.

    states = [
        RankState(rank=0, last_step=119, current_step=120, last_step_ts=1000.0,
                  last_heartbeat_ts=1041.0,
                  inflight=Inflight(group="dp", op="all_reduce", seq=4502, since=1000.4)),
        RankState(rank=1, last_step=119, current_step=120, last_step_ts=1000.0,
                  last_heartbeat_ts=1041.2, inflight=None),        # never entered it
    ]
    detect(states, now=1041.5, step_durations=[0.31, 0.30, 0.33])
    # -> [Finding(kind="hang", ranks=(1,), first_step=120, key="hang:step=120", ...)]

Two conditions, judged on the latest heartbeat and step of every rank at ``now``:

- **crash**: a rank has sent nothing (heartbeat or step) for longer than the heartbeat timeout,
  ``max(heartbeat_floor_s, heartbeat_factor * heartbeat_interval_s)``.
- **hang**: ranks are alive but no rank has finished a step for longer than the step timeout,
  learned from the job's own step times: ``max(floor_s, safety_factor * slowest recent step)``.
  A job with 0.3 s steps is flagged after 10 s; one with 60 s steps after 5 minutes.

**Culprits of a hang.** Every rank reports the collective it is blocked in (group, op, seq).
The waits form a graph: a rank waiting in a collective waits for the members of that group that
have not entered it; a rank in a point-to-point op (send/recv, a batch of them, on any group)
waits for each peer whose transfer has not finished, unless that peer is in a p2p op with it
too. The graph is followed transitively, so a pipeline stage blocked in a ``recv`` from a stage
that itself waits (in a ``recv``, a ``send`` or a data-parallel all-reduce) points past it to
where the waits end. The culprits are the ends of the waits (the sink components of the graph):
ranks
in no collective (computing, loading data, stuck in Python), ranks in an *earlier* seq of a group
whose other ranks have moved on (their program diverged), ranks that crashed or never reported,
and the ranks of a collective all its members entered but that does not finish (a link or a
GPU). When the waits form a cycle with no way out (mismatched collective order) the ranks of
the cycle are the culprits. When that would name every alive rank, ranks behind in step are
preferred; when none are, the hang is reported with no culprit (``ranks=()``) and a note.
Group membership (``groups``) makes this exact; without it a collective is taken to wait for
every rank outside it, which is right for the world group and conservative for the others (the
graph stays linear in the number of ranks either way).

**Crash versus hang.** When ranks crash the survivors soon hang waiting for them. The crash is
the cause, so a single ``crash`` finding is reported and the survivors' hang (how long, in which
collective, who waits) goes into its evidence; no separate ``hang`` finding is opened, so the
recovery policy acts once (restart) instead of also acting on the consequence. Alive ranks that
are roots of the survivors' waits on their own (a second fault: stuck, and waiting for no
crashed rank) are named in the ``crash`` finding too (``stuck_ranks``, ``culprit_reasons``).

**A failed node.** The ranks of a node that fails die together, but their last heartbeats
are up to one interval apart, so when the first is past the timeout the others are quiet
for only a little less. Once a rank is dead, the ranks *of its host* quiet for two
heartbeat intervals are dead too, and named in the same ``crash``. Ranks on other hosts (or
whose host is not known) are judged on the timeout alone: two intervals of quiet is what a
server that is behind (overloaded, a backlog of batches) makes of many live ranks at once,
and naming them would turn one crash into dozens.

**A server that is behind.** Under an ingest backlog the heartbeats (let in ahead of the
telemetry) are fresh while the stored steps are old. A heartbeat in a step past the newest
stored one says steps finished that are not stored yet: that is no hang, however old the
stored steps are (a hang then shows once the stored steps catch up with it).

**A job that stopped.** When every rank falls silent within one heartbeat timeout of the others
the job is taken to have stopped (finished, cancelled, preempted) and nothing is reported,
unless the caller says the job should still be running (``finished=False``), which makes it a
crash of every rank. ``finished=True`` (the launcher reported a clean exit) reports nothing.
Ranks that fell silent well before the others are still a crash: the rest stopped after them.
Hangs before the first finished step are not judged (there is no step time to learn from).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from numpy.typing import ArrayLike

from detectors.finding import Finding
from detectors.registry import register
from detectors.waits import attribute, terminal_components
from detectors.window import Inflight, RankState, Window

__all__ = [
    "HangConfig",
    "Inflight",
    "RankState",
    "StepTimeout",
    "detect",
    "learn_timeout",
    "terminal_components",
]

N = TypeVar("N", bound=Hashable)
_MAX_EVIDENCE = 100  # longest list kept in a finding's evidence


@dataclass(frozen=True)
class HangConfig:
    """Thresholds; the step timeout is learned, these only bound it.

    floor_s: the step timeout never goes below this.
    safety_factor: step timeout = safety_factor * the median recent step ...
    slowest_factor: ... but at least slowest_factor * the slowest one (a job whose steps
        vary, e.g. an evaluation every N steps, is not called hung in its slow steps).
    no_history_timeout_s: step timeout while no step duration is known.
    heartbeat_interval_s: how often the collector sends a heartbeat.
    heartbeat_floor_s, heartbeat_factor: a rank silent for longer than
        max(heartbeat_floor_s, heartbeat_factor * heartbeat_interval_s) has crashed.
    """

    floor_s: float = 10.0
    safety_factor: float = 4.5
    slowest_factor: float = 1.5
    no_history_timeout_s: float = 300.0
    heartbeat_interval_s: float = 1.0
    heartbeat_floor_s: float = 5.0
    heartbeat_factor: float = 5.0

    @property
    def heartbeat_timeout_s(self) -> float:
        return max(self.heartbeat_floor_s, self.heartbeat_factor * self.heartbeat_interval_s)


@dataclass(frozen=True)
class StepTimeout:
    """The learned step timeout and how it was reached (``how`` is for people)."""

    seconds: float
    source: str  # "learned" | "floor" | "no_history"
    slowest_step_s: float | None
    n_steps: int
    how: str


def learn_timeout(step_durations: ArrayLike, config: HangConfig | None = None) -> StepTimeout:
    """``max(floor_s, safety_factor * median, slowest_factor * slowest)`` of recent steps;
    non-finite or ≤ 0 values dropped.

    >>> learn_timeout([0.3, 0.5, 0.4]).seconds
    10.0
    >>> learn_timeout([50.0, 60.0]).seconds
    247.5
    """
    cfg = config or HangConfig()
    d = np.asarray(step_durations, dtype=float).ravel()
    d = d[np.isfinite(d) & (d > 0)]
    if d.size == 0:
        return StepTimeout(
            seconds=cfg.no_history_timeout_s,
            source="no_history",
            slowest_step_s=None,
            n_steps=0,
            how=f"no step durations yet; default {cfg.no_history_timeout_s:g} s",
        )
    slowest = float(d.max())
    median = float(np.median(d))
    scaled = max(cfg.safety_factor * median, cfg.slowest_factor * slowest)
    basis = (
        f"max({cfg.safety_factor:g} * median {median:.3g} s, "
        f"{cfg.slowest_factor:g} * slowest {slowest:.3g} s) of the last {d.size} steps"
    )
    if scaled >= cfg.floor_s:
        return StepTimeout(scaled, "learned", slowest, int(d.size), f"{basis} = {scaled:.3g} s")
    how = f"floor {cfg.floor_s:g} s ({basis} is {scaled:.3g} s)"
    return StepTimeout(cfg.floor_s, "floor", slowest, int(d.size), how)


def _ranks_text(ranks: Sequence[int], limit: int = 10) -> str:
    if not ranks:
        return "no rank"
    word = "rank" if len(ranks) == 1 else "ranks"
    more = f" and {len(ranks) - limit} more" if len(ranks) > limit else ""
    return f"{word} {', '.join(map(str, ranks[:limit]))}{more}"


def detect(
    states: Sequence[RankState],
    *,
    now: float,
    step_durations: ArrayLike,
    groups: Mapping[str, Collection[int]] | None = None,
    finished: bool | None = None,
    config: HangConfig | None = None,
    unreported: Collection[int] = (),
    started_ts: float | None = None,
    exited: Mapping[int, float] | None = None,
) -> list[Finding]:
    """Hang and crash findings for one job at time ``now``.

    ``step_durations``: recent step times in seconds (any ranks), to learn the step timeout.
    ``groups``: optional process-group membership (group name → global ranks).
    ``finished``: ``True`` when the job is known to have exited cleanly (nothing to report),
    ``False`` when it is known to be still running, ``None`` when unknown.
    ``unreported``: ranks of the world that have sent nothing yet; ``started_ts``: when the
    run was first seen. Until every rank reported or the run is a heartbeat timeout old,
    nothing is judged: the first batches of a run arrive over a second or so, and ranks
    waiting in a collective for ranks whose state has not arrived yet would otherwise be
    judged without them (a hang with no culprit, or the wrong one).
    ``exited``: ranks of the run that said goodbye → when they were last heard from. Waited
    for, they are culprits ("exited"), as when one rank leaves its training loop early; but
    ranks that left after the job was already hung are a hung job being stopped (node by
    node): the finding then says it sees only part of the episode (``partial_view``) and an
    open incident keeps the diagnosis it had (``backend.incidents.service``).
    """
    cfg = config or HangConfig()
    exited = exited or {}
    if finished or not states:
        return []
    hb_timeout = cfg.heartbeat_timeout_s
    if unreported and (started_ts is None or now - started_ts <= hb_timeout):
        return []  # the run is starting: its picture is not whole yet
    timeout = learn_timeout(step_durations, cfg)

    silent = {s.rank: now - s.last_seen_ts for s in states if now - s.last_seen_ts > hb_timeout}
    dead: set[int] = set(silent)
    if dead and len(dead) < len(states):
        dead |= _node_mates(states, dead, now=now, quiet_s=2 * cfg.heartbeat_interval_s)
    stopped_together = False
    if len(dead) == len(states):
        newest = max(s.last_seen_ts for s in states)
        dead = {s.rank for s in states if newest - s.last_seen_ts > hb_timeout}
        if not dead:
            if finished is None:
                return []  # every rank stopped at once: the job stopped
            dead = set(silent)
            stopped_together = True

    progress = [s.last_step_ts for s in states if s.last_step_ts is not None]
    last_progress = max(progress) if progress else None
    stalled_s = None if last_progress is None else now - last_progress
    alive = [s for s in states if s.rank not in dead]
    # With no rank in any collective the job is working outside communication (a
    # synchronous checkpoint, evaluation on one rank, …): allow the long timeout.
    limit = timeout.seconds
    if not any(s.inflight is not None for s in alive):
        limit = max(limit, cfg.no_history_timeout_s)
    hung = stalled_s is not None and stalled_s > limit and not _steps_behind(alive)
    steps = [s.step_in_progress for s in (alive or states)]
    stop_steps = [v for v in steps if v is not None]
    stuck_step = min(stop_steps) if stop_steps else None
    timeout_ev = {
        "timeout_s": timeout.seconds,
        "timeout_source": timeout.source,
        "timeout_how": timeout.how,
        "slowest_step_s": timeout.slowest_step_s,
        "n_steps": timeout.n_steps,
    }

    if dead:
        survivors: dict[str, Any] | None = None
        if alive and stalled_s is not None:
            survivors = {"stalled_s": stalled_s, "hung": hung, **timeout_ev}
        note = stopped_together
        return [_crash(states, dead, survivors, groups, now, hb_timeout, note=note, exited=exited)]

    if not hung or stalled_s is None:
        return []

    att = attribute(states, (), groups, now, exited=exited)
    ev = {"stalled_s": stalled_s, **timeout_ev, "culprit_reasons": att.reasons}
    hung_since = now - stalled_s + limit  # when no progress became a hang
    leaving = [r for r, ts in exited.items() if ts > hung_since]
    if leaving:
        ev["partial_view"] = f"{len(leaving)} ranks exited after the job hung"
    where = ""
    if att.primary is not None:
        p = att.primary
        ev["collective"] = {"group": p["group"], "op": p["op"], "seq": p["seq"]}
        ev["waiting_ranks"] = p["ranks"]
        ev["waiting_s"] = p["waiting_s"]
        n = len(p["ranks"])
        who = "1 rank waits" if n == 1 else f"{n} ranks wait"
        where = f"; {who} in {p['group']} {p['op']} seq {p['seq']}"
    ev.update(att.evidence)
    summary = (
        f"no step finished for {stalled_s:.0f} s (timeout {timeout.seconds:.3g} s, "
        f"{timeout.source}){where}"
    )
    if att.culprits:
        why = sorted(set(att.reasons.values()))
        summary += f"; culprit {_ranks_text(att.culprits)}: {'; '.join(why)}"
    elif "note" in att.evidence:
        summary += f"; {att.evidence['note']}"
    return [
        Finding(
            kind="hang",
            severity="critical",
            ranks=att.culprits,
            first_step=stuck_step,
            score=stalled_s / timeout.seconds,
            summary=summary,
            key=f"hang:step={stuck_step if stuck_step is not None else 'unknown'}",
            evidence=ev,
        )
    ]


def _steps_behind(states: Sequence[RankState]) -> bool:
    """Whether a rank's heartbeat is in a step past the newest finished step known: steps
    finished that have not been stored yet. The server is behind (an ingest backlog, the
    heartbeats let in ahead of the telemetry), not the job: no hang.

    >>> a = RankState(0, 480, 505, 90.0, 120.0)  # heartbeat: in step 505; stored: 480
    >>> _steps_behind([a]), _steps_behind([RankState(0, 480, 481, 90.0, 120.0)])
    (True, False)
    """
    done = [s.last_step for s in states if s.last_step is not None]
    if not done:
        return False
    newest = max(done)
    return any(s.current_step is not None and s.current_step > newest + 1 for s in states)


def _node_mates(
    states: Sequence[RankState], dead: Collection[int], *, now: float, quiet_s: float
) -> set[int]:
    """Ranks quiet for ``quiet_s`` on a host where a rank in ``dead`` is: the node failed.

    >>> a = RankState(0, 9, 10, 90.0, 91.0, host="a")  # dead
    >>> b = RankState(1, 9, 10, 90.0, 97.0, host="a")  # quiet 3 s, on the same node
    >>> c = RankState(2, 9, 10, 90.0, 97.0, host="b")  # as quiet, on another node
    >>> sorted(_node_mates([a, b, c], {0}, now=100.0, quiet_s=2.0))
    [1]
    """
    hosts = {s.host for s in states if s.rank in dead and s.host is not None}
    return {
        s.rank
        for s in states
        if s.host in hosts and s.rank not in dead and now - s.last_seen_ts > quiet_s
    }


def _crash(
    states: Sequence[RankState],
    dead: Collection[int],
    survivors: dict[str, Any] | None,
    groups: Mapping[str, Collection[int]] | None,
    now: float,
    hb_timeout: float,
    *,
    note: bool,
    exited: Collection[int] = (),
) -> Finding:
    """The ``crash`` finding: the silent ranks, and, once the survivors are hung (their
    ``survivors`` evidence), alive ranks that are roots of their waits too: stuck on their
    own, not waiting for the crash (a second fault), so restarting for the crash alone
    would hide them."""
    by_rank = {s.rank: s for s in states}
    crashed = tuple(sorted(dead))
    first = min(crashed, key=lambda r: (by_rank[r].last_seen_ts, r))
    crash_steps = [v for r in crashed if (v := by_rank[r].step_in_progress) is not None]
    alive = len(states) - len(crashed)
    ev: dict[str, Any] = {
        "silent_s": {str(r): now - by_rank[r].last_seen_ts for r in crashed},
        "heartbeat_timeout_s": hb_timeout,
        "first_silent_rank": first,
        "alive_ranks": sorted(s.rank for s in states if s.rank not in dead),
    }
    if note:
        ev["note"] = "every rank stopped reporting at once while the job should be running"
    stuck: list[int] = []
    if survivors is not None:
        if survivors["hung"]:
            att = attribute(states, dead, groups, now, exited=exited)
            survivors["waiting_for"] = list(att.culprits)
            survivors["reasons"] = att.reasons
            survivors.update(att.evidence)
            stuck = [r for r in att.culprits if r not in dead]
            if stuck:
                ev["stuck_ranks"] = stuck
                ev["culprit_reasons"] = {str(r): att.reasons[str(r)] for r in stuck}
        ev["survivors"] = survivors
    summary = (
        f"{_ranks_text(crashed)} stopped sending heartbeats "
        f"({max(ev['silent_s'].values()):.0f} s, timeout {hb_timeout:g} s)"
    )
    if crash_steps:
        summary += f" in step {min(crash_steps)}"
    if survivors is not None and survivors["hung"]:
        summary += f"; the other {alive} ranks have made no progress since"
    if stuck:
        summary += f", and {_ranks_text(stuck)} waits for none of them (stuck too)"
    return Finding(
        kind="crash",
        severity="critical",
        ranks=tuple(sorted({*crashed, *stuck})),
        first_step=min(crash_steps) if crash_steps else None,
        score=float(len(crashed)),
        summary=summary,
        key=f"crash:{first}",
        evidence=ev,
    )


@register("hang", kinds={"hang", "crash"}, needs={"liveness"})
def _detect_window(window: Window) -> list[Finding]:
    live = window.liveness
    assert live is not None
    return detect(
        live.states,
        now=live.now,
        step_durations=live.step_durations,
        groups=live.groups or None,
        # Training ranks that exit cleanly say so (they are not in ``states``); all going
        # silent together without a word is a crash (a launcher tearing the group down
        # after one rank died), not an end. Serving replicas make no such promise.
        finished=False if live.expect_running else None,
        unreported=live.unreported,
        started_ts=live.started_ts,
        exited=live.exited,
    )

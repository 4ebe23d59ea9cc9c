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
have not entered it; a rank in a point-to-point op waits for its peer unless the peer is in the
matching op. The culprits are the ends of the waits (the sink components of the graph): ranks
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
recovery policy acts once (restart) instead of also acting on the consequence.

**A job that stopped.** When every rank falls silent within one heartbeat timeout of the others
the job is taken to have stopped (finished, cancelled, preempted) and nothing is reported,
unless the caller says the job should still be running (``finished=False``), which makes it a
crash of every rank. ``finished=True`` (the launcher reported a clean exit) reports nothing.
Ranks that fell silent well before the others are still a crash: the rest stopped after them.
Hangs before the first finished step are not judged (there is no step time to learn from).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from numpy.typing import ArrayLike
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from detectors.finding import Finding

N = TypeVar("N", bound=Hashable)
_MAX_EVIDENCE = 100  # longest list kept in a finding's evidence


@dataclass(frozen=True)
class Inflight:
    """The operation a rank is blocked in: the oldest it has not finished.

    ``since`` is when the rank entered it (wall-clock seconds). ``peer`` is the global rank on
    the other side of a point-to-point op (send/recv); ``None`` for a collective.
    """

    group: str
    op: str
    seq: int
    since: float
    peer: int | None = None


@dataclass(frozen=True)
class RankState:
    """The latest the backend knows of one rank.

    ``last_step`` is the last step the rank finished, at ``last_step_ts``; ``current_step`` the
    step its latest heartbeat says it is in (``None``: ``last_step + 1``).
    ``last_heartbeat_ts`` is the latest time anything arrived from the rank.
    """

    rank: int
    last_step: int | None
    current_step: int | None
    last_step_ts: float | None
    last_heartbeat_ts: float
    inflight: Inflight | None = None

    @property
    def step_in_progress(self) -> int | None:
        if self.current_step is not None:
            return self.current_step
        return None if self.last_step is None else self.last_step + 1

    @property
    def last_seen_ts(self) -> float:
        """A finished step is a sign of life too."""
        if self.last_step_ts is None:
            return self.last_heartbeat_ts
        return max(self.last_heartbeat_ts, self.last_step_ts)


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


def terminal_components(edges: Mapping[N, Iterable[N]]) -> list[frozenset[N]]:
    """Strongly connected components of a wait-for graph that no edge leaves.

    ``edges[a]`` holds what ``a`` waits for. A node that waits for nothing but is waited for is
    a component of its own; a set of nodes that only wait for each other (a deadlock) is one
    component. Nodes that appear nowhere in ``edges`` are not part of the graph.

    >>> sorted(map(sorted, terminal_components({1: [2], 2: [3], 4: [3]})))
    [[3]]
    """
    nodes: dict[N, int] = {}
    sources: list[int] = []
    targets: list[int] = []
    for node, waits_for in edges.items():
        a = nodes.setdefault(node, len(nodes))
        for t in waits_for:
            sources.append(a)
            targets.append(nodes.setdefault(t, len(nodes)))
    if not nodes:
        return []
    # Strong components in C (scipy), not a Python Tarjan walk: a hung 16k-rank job's graph
    # has tens of thousands of nodes and the sweep must stay well inside its budget.
    src = np.asarray(sources, dtype=np.int64)
    dst = np.asarray(targets, dtype=np.int64)
    n = len(nodes)
    matrix = csr_matrix((np.ones(src.size, dtype=np.int8), (src, dst)), shape=(n, n))
    n_comps, labels = connected_components(matrix, directed=True, connection="strong")
    leaving = np.zeros(n_comps, dtype=bool)  # components with an edge to another component
    crossing = labels[src] != labels[dst]
    leaving[labels[src[crossing]]] = True
    by_label: dict[int, list[N]] = {}
    for node, i in nodes.items():
        label = int(labels[i])
        if not leaving[label]:
            by_label.setdefault(label, []).append(node)
    return [frozenset(members) for members in by_label.values()]


# ---------------------------------------------------------------------------------------------
# Who the job waits for


@dataclass(frozen=True)
class _Attribution:
    culprits: tuple[int, ...]
    reasons: dict[str, str]
    primary: dict[str, Any] | None  # the collective most ranks wait in
    evidence: dict[str, Any]


def _attribute(
    states: Sequence[RankState],
    dead: Collection[int],
    groups: Mapping[str, Collection[int]] | None,
    now: float,
) -> _Attribution:
    by_rank = {s.rank: s for s in states}
    alive = [s for s in states if s.rank not in dead]
    inflight = {s.rank: s.inflight for s in alive if s.inflight is not None}
    coll: dict[tuple[str, int], set[int]] = defaultdict(set)
    for r, f in inflight.items():
        if f.peer is None:
            coll[(f.group, f.seq)].add(r)
    max_seq: dict[str, int] = {}
    for g, q in coll:
        max_seq[g] = max(q, max_seq.get(g, q))
    # A rank in an earlier seq of a group whose other ranks have moved on waits for nobody:
    # no one will join it.
    behind = {r for r, f in inflight.items() if f.peer is None and f.seq < max_seq[f.group]}

    # Nodes: ("r", rank), ("c", group, seq), and HUB. Waiters point at their collective, the
    # collective at the members that are not in it. Without membership a collective waits for
    # every rank not in it, through HUB, which keeps the graph linear in the number of ranks.
    hub: tuple[Any, ...] = ("hub",)
    edges: dict[tuple[Any, ...], set[tuple[Any, ...]]] = defaultdict(set)
    for (g, q), waiters in coll.items():
        if q != max_seq[g]:
            continue
        node = ("c", g, q)
        if groups is not None and g in groups:
            targets = {("r", m) for m in set(groups[g]) - waiters}
        else:
            targets = {hub}  # membership unknown: every rank outside it
        if targets:  # a collective all members entered waits for nobody
            edges[node] = targets
            for w in waiters:
                edges[("r", w)].add(node)
    p2p: list[list[int]] = []
    for r, f in inflight.items():
        if f.peer is None:
            continue
        pf = inflight.get(f.peer)
        if pf is not None and pf.peer == r:
            continue  # both sides posted; the pair is not waiting for each other
        edges[("r", r)].add(("r", f.peer))
        p2p.append([r, f.peer])
    if hub in {t for ts in edges.values() for t in ts}:
        edges[hub].update(("c", g, q) for g, q in coll if q == max_seq[g])
        edges[hub].update(("r", s.rank) for s in states if s.rank not in inflight)
        edges[hub].update(("r", r) for r, f in inflight.items() if f.peer is not None)
        edges[hub].update(("r", r) for r in behind)
    # A rank still in an earlier seq that others have passed waits for the members that are
    # in no collective at all (e.g. a gloo broadcast root waiting for a receiver that never
    # came, while other receivers finished). With no such member it waits for nobody.
    everyone = {s.rank for s in states}
    for b in behind:
        g = inflight[b].group
        members = set(groups[g]) if groups is not None and g in groups else everyone
        idle = {m for m in members - {b} if m not in inflight}
        if idle:
            edges[("r", b)] = {("r", m) for m in idle}
        else:
            edges.pop(("r", b), None)

    culprit_set: set[int] = set()
    cycles: set[int] = set()
    for comp in terminal_components(edges):
        ranks = {n[1] for n in comp if n[0] == "r"}
        ranks |= {r for n in comp if n[0] == "c" for r in coll[(n[1], n[2])]}
        for r in list(ranks):  # stuck in a collective all members entered: all of them
            at = inflight.get(r)
            if at is not None and at.peer is None and r not in behind:
                ranks |= coll[(at.group, at.seq)]
        if len(comp) > 1:
            cycles |= ranks
        culprit_set |= ranks

    alive_ranks = {s.rank for s in alive}
    note = None
    lagging: set[int] = set()
    if len(alive_ranks) > 1 and alive_ranks <= culprit_set:
        steps = {r: by_rank[r].step_in_progress for r in alive_ranks}
        top = max((v for v in steps.values() if v is not None), default=None)
        lagging = {r for r, v in steps.items() if top is not None and v is not None and v < top}
        culprit_set = lagging | (culprit_set - alive_ranks)
    if not coll and not p2p and alive:
        note = "no rank is in a collective: the job stalled outside communication"
        culprit_set = set()
    elif not culprit_set:
        note = (
            "every rank that waits is in a collective all its members entered: "
            "suspect the network or a GPU rather than a rank"
        )

    def entered(waiters: set[int]) -> float:
        return min(inflight[r].since for r in waiters)

    def why(r: int) -> str:
        st = by_rank.get(r)
        f = inflight.get(r)
        if st is None:
            return "sent no state at all"
        if r in dead:
            return "crashed (heartbeats stopped)"
        if r in lagging:
            return f"behind in step ({st.step_in_progress})"
        if f is None:
            return "in no collective (computing, loading data or stuck in Python)"
        if r in behind:
            return (
                f"in {f.group} {f.op} seq {f.seq}, which the other ranks of {f.group} have "
                f"passed (they wait in seq {max_seq[f.group]})"
            )
        if r in cycles:
            return f"in {f.group} {f.op} seq {f.seq}, waiting in a cycle (mismatched order)"
        return f"in {f.group} {f.op} seq {f.seq}, which all its members entered"

    # Most waiters first; ties go to the collective entered first, then to the name.
    order = sorted(coll, key=lambda k: (-len(coll[k]), entered(coll[k]), k))
    collectives = [
        {
            "group": g,
            "op": inflight[min(coll[(g, q)])].op,
            "seq": q,
            "ranks": sorted(coll[(g, q)]),
            "waiting_s": now - entered(coll[(g, q)]),
        }
        for g, q in order
    ]
    evidence: dict[str, Any] = {
        "collectives": collectives[:_MAX_EVIDENCE],
        "p2p_waits": sorted(p2p)[:_MAX_EVIDENCE],
        "idle_ranks": sorted(s.rank for s in alive if s.inflight is None)[:_MAX_EVIDENCE],
    }
    if note:
        evidence["note"] = note
    culprits = tuple(sorted(culprit_set))
    return _Attribution(
        culprits=culprits,
        reasons={str(r): why(r) for r in culprits[:_MAX_EVIDENCE]},
        primary=collectives[0] if collectives else None,
        evidence=evidence,
    )


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
) -> list[Finding]:
    """Hang and crash findings for one job at time ``now``.

    ``step_durations``: recent step times in seconds (any ranks), to learn the step timeout.
    ``groups``: optional process-group membership (group name → global ranks).
    ``finished``: ``True`` when the job is known to have exited cleanly (nothing to report),
    ``False`` when it is known to be still running, ``None`` when unknown.
    """
    cfg = config or HangConfig()
    if finished or not states:
        return []
    hb_timeout = cfg.heartbeat_timeout_s
    timeout = learn_timeout(step_durations, cfg)

    silent = {s.rank: now - s.last_seen_ts for s in states if now - s.last_seen_ts > hb_timeout}
    dead: set[int] = set(silent)
    if dead and len(dead) < len(states):
        # Ranks of a failed node die together but their last heartbeats are up to one
        # interval apart: once one is dead, a rank quiet for two intervals is dead too.
        quiet = 2 * cfg.heartbeat_interval_s
        dead |= {s.rank for s in states if now - s.last_seen_ts > quiet}
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
    hung = stalled_s is not None and stalled_s > limit
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
        by_rank = {s.rank: s for s in states}
        crashed = tuple(sorted(dead))
        first = min(crashed, key=lambda r: (by_rank[r].last_seen_ts, r))
        crash_steps = [v for r in crashed if (v := by_rank[r].step_in_progress) is not None]
        ev: dict[str, Any] = {
            "silent_s": {str(r): now - by_rank[r].last_seen_ts for r in crashed},
            "heartbeat_timeout_s": hb_timeout,
            "first_silent_rank": first,
            "alive_ranks": sorted(s.rank for s in alive),
        }
        if stopped_together:
            ev["note"] = "every rank stopped reporting at once while the job should be running"
        if alive and stalled_s is not None:
            survivors: dict[str, Any] = {"stalled_s": stalled_s, "hung": hung, **timeout_ev}
            if hung:
                att = _attribute(states, dead, groups, now)
                survivors["waiting_for"] = list(att.culprits)
                survivors["reasons"] = att.reasons
                survivors.update(att.evidence)
            ev["survivors"] = survivors
        summary = (
            f"{_ranks_text(crashed)} stopped sending heartbeats "
            f"({max(ev['silent_s'].values()):.0f} s, timeout {hb_timeout:g} s)"
        )
        if crash_steps:
            summary += f" in step {min(crash_steps)}"
        if alive and hung:
            summary += f"; the other {len(alive)} ranks have made no progress since"
        return [
            Finding(
                kind="crash",
                severity="critical",
                ranks=crashed,
                first_step=min(crash_steps) if crash_steps else None,
                score=float(len(crashed)),
                summary=summary,
                key=f"crash:{first}",
                evidence=ev,
            )
        ]

    if not hung or stalled_s is None:
        return []

    att = _attribute(states, (), groups, now)
    ev = {"stalled_s": stalled_s, **timeout_ev, "culprit_reasons": att.reasons}
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

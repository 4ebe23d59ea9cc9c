"""Who a hung job waits for: the wait-for graph of its ranks and the ends of its waits.

Every rank reports the operation it is blocked in (group, op, seq; for a point-to-point op
its ``peers``). A rank waiting in a collective waits for the members of that group that have
not entered it; a rank in a point-to-point op waits for each peer whose transfer has not
finished, unless the peer is in a p2p op with it too (:func:`_p2p_waits`). A receive from an
unknown source waits for anyone. The culprits are the ends of the waits, however long the
chain: the terminal strong components of that graph (see ``detectors.hang`` for the rules,
and :func:`terminal_components`), never the ranks that wait nor the peers they wait for.

    >>> from detectors.window import Inflight, RankState
    >>> waiting = Inflight(group="world", op="all_reduce", seq=4502, since=1000.4)
    >>> att = attribute([RankState(0, 119, 120, 1000.0, 1041.0, waiting),
    ...                  RankState(1, 119, 120, 1000.0, 1041.2, None)], (), None, 1041.5)
    >>> att.culprits, att.reasons
    ((1,), {'1': 'in no collective (computing, loading data or stuck in Python)'})
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from detectors.window import Inflight, RankState

__all__ = ["Attribution", "attribute", "terminal_components"]

N = TypeVar("N", bound=Hashable)
_MAX_EVIDENCE = 100  # longest list kept in a finding's evidence


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
class Attribution:
    culprits: tuple[int, ...]
    reasons: dict[str, str]
    primary: dict[str, Any] | None  # the collective most ranks wait in
    evidence: dict[str, Any]


Node = tuple[Any, ...]  # ("r", rank) | ("c", group, seq) | HUB
HUB: Node = ("hub",)


@dataclass
class _P2P:
    """Point-to-point waits: who waits for whom, and the ops whose peers posted theirs."""

    waits: list[list[int]]  # [rank, peer it waits for]
    anyone: set[int]  # ranks receiving from any source (or from peers the collector did not say)
    matched: dict[int, set[int]]  # rank -> peers in the matching op (both posted)


def _p2p_waits(inflight: Mapping[int, Inflight]) -> _P2P:
    """A rank in a send or receive waits for each peer whose transfer has not finished,
    unless that peer is in a p2p op with it too (both posted: neither waits for the other).
    A peer in anything else (a collective, computing, another transfer, dead) is waited for,
    whatever it waits for in turn: the graph, not this rule, follows the chain."""
    out = _P2P([], set(), defaultdict(set))
    for r, f in inflight.items():
        if not f.p2p:
            continue
        if not f.peers:
            out.anyone.add(r)
            continue
        for peer in f.peers:
            pf = inflight.get(peer)
            if pf is not None and pf.p2p and (r in (pf.peers or ()) or not pf.peers):
                out.matched[r].add(peer)
            else:
                out.waits.append([r, peer])
    return out


def attribute(
    states: Sequence[RankState],
    dead: Collection[int],
    groups: Mapping[str, Collection[int]] | None,
    now: float,
    exited: Collection[int] = (),
) -> Attribution:
    """``exited``: ranks that said goodbye (not in ``states``): waited for, they are named
    as having left rather than as having sent nothing."""
    by_rank = {s.rank: s for s in states}
    alive = [s for s in states if s.rank not in dead]
    inflight = {s.rank: s.inflight for s in alive if s.inflight is not None}
    coll: dict[tuple[str, int], set[int]] = defaultdict(set)
    for r, f in inflight.items():
        if not f.p2p:
            coll[(f.group, f.seq)].add(r)
    max_seq: dict[str, int] = {}
    for g, q in coll:
        max_seq[g] = max(q, max_seq.get(g, q))
    # A rank in an earlier seq of a group whose other ranks have moved on waits for nobody:
    # no one will join it.
    behind = {r for r, f in inflight.items() if not f.p2p and f.seq < max_seq[f.group]}

    # Nodes: ("r", rank), ("c", group, seq), and HUB. Waiters point at their collective, the
    # collective at the members that are not in it. Without membership a collective waits for
    # every rank not in it, through HUB, which keeps the graph linear in the number of ranks.
    edges: dict[Node, set[Node]] = defaultdict(set)
    for (g, q), waiters in coll.items():
        if q != max_seq[g]:
            continue
        node = ("c", g, q)
        if groups is not None and g in groups:
            targets = {("r", m) for m in set(groups[g]) - waiters}
        else:
            targets = {HUB}  # membership unknown: every rank outside it
        if targets:  # a collective all members entered waits for nobody
            edges[node] = targets
            for w in waiters:
                edges[("r", w)].add(node)
    p2p = _p2p_waits(inflight)
    for r, peer in p2p.waits:
        edges[("r", r)].add(("r", peer))
    for r in p2p.anyone:
        edges[("r", r)].add(HUB)
    if HUB in {t for ts in edges.values() for t in ts}:
        edges[HUB].update(("c", g, q) for g, q in coll if q == max_seq[g])
        edges[HUB].update(("r", s.rank) for s in states if s.rank not in inflight)
        edges[HUB].update(("r", r) for r, f in inflight.items() if f.p2p)
        edges[HUB].update(("r", r) for r in behind)
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
        for r in list(ranks):  # stuck in an op all its members or peers entered: all of them
            at = inflight.get(r)
            if at is not None and not at.p2p and r not in behind:
                ranks |= coll[(at.group, at.seq)]
            ranks |= p2p.matched.get(r, set())
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
    if not inflight and alive:
        note = "no rank is in a collective: the job stalled outside communication"
        culprit_set = set()
    elif not culprit_set:
        note = (
            "every rank that waits is in a collective all its members entered: "
            "suspect the network or a GPU rather than a rank"
        )

    def why(r: int) -> str:
        st = by_rank.get(r)
        f = inflight.get(r)
        if st is None:
            return "exited (said goodbye)" if r in exited else "sent no state at all"
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
        if f.p2p:
            peers = ", ".join(map(str, sorted(p2p.matched.get(r, ())))) or "?"
            return f"in {f.group} {f.op} with rank {peers}, which posted the matching op"
        return f"in {f.group} {f.op} seq {f.seq}, which all its members entered"

    collectives = _collectives(coll, inflight, now)
    evidence: dict[str, Any] = {
        "collectives": collectives[:_MAX_EVIDENCE],
        "p2p_waits": sorted(p2p.waits)[:_MAX_EVIDENCE],
        "idle_ranks": sorted(s.rank for s in alive if s.inflight is None)[:_MAX_EVIDENCE],
    }
    if note:
        evidence["note"] = note
    culprits = tuple(sorted(culprit_set))
    return Attribution(
        culprits=culprits,
        reasons={str(r): why(r) for r in culprits[:_MAX_EVIDENCE]},
        primary=collectives[0] if collectives else None,
        evidence=evidence,
    )


def _collectives(
    coll: Mapping[tuple[str, int], set[int]], inflight: Mapping[int, Inflight], now: float
) -> list[dict[str, Any]]:
    """The collectives ranks wait in: most waiters first; ties go to the one entered first,
    then to the name."""

    def entered(waiters: set[int]) -> float:
        return min(inflight[r].since for r in waiters)

    order = sorted(coll, key=lambda k: (-len(coll[k]), entered(coll[k]), k))
    return [
        {
            "group": g,
            "op": inflight[min(coll[(g, q)])].op,
            "seq": q,
            "ranks": sorted(coll[(g, q)]),
            "waiting_s": now - entered(coll[(g, q)]),
        }
        for g, q in order
    ]

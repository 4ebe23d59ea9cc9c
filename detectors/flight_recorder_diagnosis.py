"""Which ranks a hang waits for, from every rank's Flight Recorder ``Dump``.

For every process group, the *stuck* collective is the lowest sequence number any member has
enqueued but not completed; the members that never entered it (no entry with that seq or
later, or no dump at all) are its *missing* ranks and the members in it are *waiting*. When
every member entered it, the first later seq that some members issued and others never did
is taken instead: those stopped issuing (``_divergence``).
Pending point-to-point ops whose counterpart the peer has not posted make the rank wait for
that peer; a send or receive counts as posted only where its rank is blocked (its oldest
pending op, or the batch of p2p ops it starts): one enqueued behind a stuck op is not posted
yet, so its peer waits for that rank (``_p2p_waits``). Across all groups these waits form a
graph, followed however long the chain; the culprits are where the waits end
(:func:`detectors.waits.terminal_components`): ranks missing somewhere that wait for nothing
themselves, e.g. a rank stuck in Python holding the GIL. A rank missing from one group because
it waits in another is a consequence, not a culprit. ``pg_status`` numbers mix collective and
p2p counters and its pg ids are local to each rank, so it is shown as evidence only.

    >>> import json
    >>> from detectors.flight_recorder_format import parse_dump
    >>> def dump(rank, *seqs):  # rank's pending all_reduces on tp group "0" = ranks 0-2
    ...     entries = [{"process_group": ["0", "tp"], "collective_seq_id": s,
    ...                 "profiling_name": "nccl:all_reduce", "state": "scheduled"} for s in seqs]
    ...     raw = {"pg_config": {"0": {"desc": "tp", "ranks": [0, 1, 2]}}, "entries": entries}
    ...     return parse_dump(json.dumps(raw).encode(), rank=rank)
    >>> dg = diagnose([dump(0, 7), dump(1, 7), dump(2)])  # rank 2 never entered seq 7
    >>> dg.culprits, dg.held_up, [(dv.seq, dv.waiting, dv.missing) for dv in dg.divergences]
    ((2,), (0, 1), [(7, (0, 1), (2,))])
    >>> dg.reasons[2]
    'never entered nccl:all_reduce seq 7 on pg 0 (tp); it has no pending operation (stuck ...)'
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from detectors.flight_recorder_format import Dump, Entry, FlightRecorderError, ProcessGroup
from detectors.waits import terminal_components

__all__ = ["Diagnosis", "Divergence", "P2PWait", "diagnose"]


@dataclass(frozen=True)
class Divergence:
    """A process group whose oldest unfinished collective not every member has entered."""

    pg_name: str
    pg_desc: str
    seq: int
    op: str
    input_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    members: tuple[int, ...]
    waiting: tuple[int, ...]
    missing: tuple[int, ...]
    blocked: tuple[int, ...]  # waiters for which this is their oldest pending op
    entered_ns: int | None  # when the first waiter entered it

    def as_dict(self) -> dict[str, Any]:
        return {
            "pg": self.pg_name,
            "pg_desc": self.pg_desc,
            "seq": self.seq,
            "op": self.op,
            "input_sizes": [list(s) for s in self.input_sizes],
            "input_dtypes": list(self.input_dtypes),
            "waiting_ranks": list(self.waiting),
            "missing_ranks": list(self.missing),
            "blocked_ranks": list(self.blocked),
            "entered_ns": self.entered_ns,
        }


@dataclass(frozen=True)
class P2PWait:
    """``rank`` posted ``count`` more ``kind`` ops to/from ``peer`` than the peer matched."""

    rank: int
    peer: int
    kind: str
    pg_name: str
    pg_desc: str
    count: int


@dataclass(frozen=True)
class Diagnosis:
    """What ``diagnose`` found; ``divergences`` starts with the one the job waits in."""

    ranks: tuple[int, ...]
    culprits: tuple[int, ...]
    reasons: Mapping[int, str]
    divergences: tuple[Divergence, ...]
    p2p_waits: tuple[P2PWait, ...]
    held_up: tuple[int, ...]  # ranks that wait, directly or not, for a culprit
    no_dump: tuple[int, ...]  # members of some group without a dump
    versions: tuple[str, ...]


def _is_at(e: Entry | None, pg_name: str, seq: int) -> bool:
    return e is not None and not e.is_p2p and (e.pg_name, e.collective_seq_id) == (pg_name, seq)


def _first(counter: Counter[str]) -> str:
    return counter.most_common(1)[0][0] if counter else "?"


def _front(entries: Sequence[Entry]) -> set[int]:
    """``id``s of the entries a rank is blocked in: its oldest pending one and, when that is a
    point-to-point op, the p2p ops pending right after it (a batch, which NCCL runs as one).
    What the rank enqueued after them waits behind them: not posted for real yet."""
    order = sorted(range(len(entries)), key=lambda i: (entries[i].record_id, i))
    pending = [entries[i] for i in order if entries[i].pending]
    if not pending:
        return set()
    out = {id(pending[0])}
    if pending[0].is_p2p:
        for e in pending[1:]:
            if not e.is_p2p:
                break
            out.add(id(e))
    return out


def _divergence(
    name: str,
    desc: str,
    members: tuple[int, ...],
    ranks_entries: Mapping[int, list[Entry]],
    oldest: Mapping[int, Entry],
) -> Divergence | None:
    """The group's oldest unfinished collective that not every member entered: its lowest
    pending seq when some member never reached it. When every member entered that one, the
    first seq that some members issued and others never did: those stopped issuing (stuck
    in Python, or their GPU), while the others' later collectives queue behind the stuck one.
    None when no member lags (every member entered everything: suspect the network)."""
    pending = [e for es in ranks_entries.values() for e in es if e.pending and not e.is_p2p]
    if not pending:
        return None
    issued = {
        m: max((e.collective_seq_id for e in ranks_entries.get(m, ())), default=-1) for m in members
    }
    seq = min(e.collective_seq_id for e in pending)
    missing = tuple(m for m in members if issued[m] < seq)
    if not missing:
        seq = min(issued.values()) + 1
        if seq > max(issued.values()):
            return None
        missing = tuple(m for m in members if issued[m] < seq)
    at = {
        r: e
        for r, es in ranks_entries.items()
        for e in es
        if e.pending and not e.is_p2p and e.collective_seq_id == seq
    }
    waiting = tuple(sorted(at))
    sample = at[waiting[0]] if waiting else None
    times = [e.time_created_ns for e in at.values() if e.time_created_ns is not None]
    return Divergence(
        pg_name=name,
        pg_desc=desc,
        seq=seq,
        op=_first(Counter(e.op for e in at.values())),
        input_sizes=sample.input_sizes if sample else (),
        input_dtypes=sample.input_dtypes if sample else (),
        members=members,
        waiting=waiting,
        missing=missing,
        blocked=tuple(r for r in waiting if _is_at(oldest.get(r), name, seq)),
        entered_ns=min(times) if times else None,
    )


def _p2p_waits(
    name: str,
    desc: str,
    group: ProcessGroup | None,
    ranks_entries: Mapping[int, list[Entry]],
    front: Mapping[int, set[int]],
) -> list[P2PWait]:
    """Pending sends and receives of one group that their peer has not matched, per (rank,
    peer, kind). A send matches a receive only when both are where their ranks are blocked
    (``_front``): one queued behind a stuck op has not been posted, so its peer waits for
    that rank, and the wait goes on to whatever blocks it."""
    posted: Counter[tuple[str, int, int]] = Counter()
    ready: Counter[tuple[str, int, int]] = Counter()
    for r, es in ranks_entries.items():
        for e in es:
            peer = e.p2p_peer(group) if e.pending and e.is_p2p else None
            if peer is not None:
                posted[(peer[0], r, peer[1])] += 1
                ready[(peer[0], r, peer[1])] += id(e) in front.get(r, ())
    out = []
    for (kind, r, to), n in posted.items():
        other = "recv" if kind == "send" else "send"
        short = n - min(ready[(kind, r, to)], ready[(other, to, r)])
        if short > 0:
            out.append(P2PWait(r, to, kind, name, desc, short))
    return out


def diagnose(dumps: Iterable[Dump]) -> Diagnosis:
    """Match operations across ranks per process group and name the culprits."""
    by_rank: dict[int, Dump] = {}
    for d in dumps:
        if d.rank in by_rank:
            where = by_rank[d.rank].source
            raise FlightRecorderError(f"{d.source}: rank {d.rank} again (also in {where})")
        by_rank[d.rank] = d
    groups: dict[str, ProcessGroup] = {}
    for d in by_rank.values():
        for name, g in d.groups.items():
            groups.setdefault(name, g)
    per_group: dict[str, dict[int, list[Entry]]] = defaultdict(lambda: defaultdict(list))
    oldest: dict[int, Entry] = {}
    for d in by_rank.values():
        for e in d.entries:
            per_group[e.pg_name][d.rank].append(e)
            if e.pending and (d.rank not in oldest or e.record_id < oldest[d.rank].record_id):
                oldest[d.rank] = e

    divergences: list[Divergence] = []
    p2p: list[P2PWait] = []
    front = {r: _front(d.entries) for r, d in by_rank.items()}
    for name, ranks_entries in per_group.items():
        group = groups.get(name)
        desc = group.desc if group else next(iter(ranks_entries.values()))[0].pg_desc
        members = group.ranks if group else tuple(sorted(ranks_entries))
        dv = _divergence(name, desc, members, ranks_entries, oldest)
        if dv is not None:
            divergences.append(dv)
        p2p += _p2p_waits(name, desc, group, ranks_entries, front)
    no_dump = {m for dv in divergences for m in dv.missing if m not in by_rank}
    no_dump |= {w.peer for w in p2p if w.peer not in by_rank}

    edges: dict[tuple[Any, ...], set[tuple[Any, ...]]] = defaultdict(set)
    for dv in divergences:
        node = ("c", dv.pg_name, dv.seq)
        for w in dv.waiting:
            edges[("r", w)].add(node)
        edges[node].update(("r", m) for m in dv.missing)
    for pw in p2p:
        edges[("r", pw.rank)].add(("r", pw.peer))
    culprit_set: set[int] = set()
    cycles: set[int] = set()
    for comp in terminal_components(edges):
        ranks = {n[1] for n in comp if n[0] == "r"}
        culprit_set |= ranks
        if len(comp) > 1:
            cycles |= ranks
    culprits = tuple(sorted(culprit_set))
    held_up = tuple(sorted({n[1] for n in edges if n[0] == "r"} - culprit_set))

    def rank_key(dv: Divergence) -> tuple[int, int, int, str]:
        t = dv.entered_ns if dv.entered_ns is not None else 2**63
        return (-len(dv.blocked), -len(dv.waiting), t, dv.pg_name)

    to_culprit = [dv for dv in divergences if culprit_set & set(dv.missing)]
    ordered = sorted(to_culprit, key=rank_key) + sorted(
        (dv for dv in divergences if dv not in to_culprit), key=rank_key
    )
    reasons = {r: _reason(r, by_rank.get(r), ordered, p2p, oldest, cycles) for r in culprits}
    return Diagnosis(
        ranks=tuple(sorted(by_rank)),
        culprits=culprits,
        reasons=reasons,
        divergences=tuple(ordered),
        p2p_waits=tuple(sorted(p2p, key=lambda w: (w.rank, w.peer, w.pg_name))),
        held_up=held_up,
        no_dump=tuple(sorted(no_dump)),
        versions=tuple(sorted({d.version for d in by_rank.values()})),
    )


def _reason(
    rank: int,
    dump: Dump | None,
    divergences: list[Divergence],
    p2p: list[P2PWait],
    oldest: Mapping[int, Entry],
    cycles: set[int],
) -> str:
    if dump is None:
        return "no Flight Recorder dump from this rank (crashed, or the dump was lost)"
    where = next((dv for dv in divergences if rank in dv.missing), None)
    if where is not None:
        text = f"never entered {where.op} seq {where.seq} on pg {where.pg_name} ({where.pg_desc})"
        st = dump.status.get(where.pg_name)
        if st is not None:
            text += f"; pg_status: last enqueued {st.last_enqueued}, completed {st.last_completed}"
    else:
        peers = [w for w in p2p if w.peer == rank]
        text = f"never posted the p2p op rank {peers[0].rank} waits for" if peers else "waited for"
    e = oldest.get(rank)
    if e is None:
        return text + "; it has no pending operation (stuck outside NCCL, e.g. in Python)"
    text += f"; it waits in {e.op} seq {e.collective_seq_id} on pg {e.pg_name}"
    if rank in cycles:
        return text + " for ranks that wait for it (mismatched order)"
    if where is not None and where.pg_name == e.pg_name and e.collective_seq_id < where.seq:
        return text + " and issued nothing after it, unlike the others (stuck, or its GPU)"
    return text + ", which no member is missing (suspect the network or a GPU)"

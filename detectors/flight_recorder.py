"""PyTorch Flight Recorder dumps: read them safely, name the ranks a hang waits for.

    dumps = load_dumps("/shared/fr/job-17/")      # one file per rank, named *_<rank>
    analyze(dumps)
    # -> [Finding(kind="hang", ranks=(9, 14), key="hang:fr:pg=72:seq=45265", ...)]
    print(render(diagnose(dumps)))

A dump (``TORCH_NCCL_TRACE_BUFFER_SIZE`` > 0, written at a watchdog timeout or on demand) is a
pickle of plain Python values: ``version``, ``pg_config`` (process group name -> desc, ranks),
``pg_status`` (local pg id -> last enqueued/started/completed seq) and ``entries``, the ring
buffer of NCCL operations with ``pg_id``, ``process_group`` (name, desc), ``collective_seq_id``,
``p2p_seq_id``, ``profiling_name``, ``input_sizes``, ``input_dtypes``, ``state``
(scheduled/started/completed), ``time_created_ns``, ... JSON dumps with the same fields are
read too. Pickles are read with an unpickler that refuses every global (dumps contain none), so
a crafted file cannot run code: it raises ``UnsafeDumpError``. Unreadable files raise
``FlightRecorderError`` (a ``ValueError``) naming the file. ``load_dump``/``load_dumps`` are the
only functions here that touch the file system; everything else works on parsed values.

**Analysis.** For every process group, the *stuck* collective is the lowest sequence number any
member has enqueued but not completed; the members that never entered it (no entry with that
seq or later, or no dump at all) are its *missing* ranks and the members in it are *waiting*.
Pending point-to-point ops whose counterpart the peer has not posted make the rank wait for
that peer. Across all groups these waits form a graph; the culprits are where the waits end
(``detectors.hang.terminal_components``): ranks missing somewhere that wait for nothing
themselves, e.g. a rank stuck in Python holding the GIL. A rank missing from one group because
it waits in another is a consequence, not a culprit. ``pg_status`` numbers mix collective and
p2p counters and its pg ids are local to each rank, so it is shown as evidence only.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detectors.finding import Finding
from detectors.hang import terminal_components

__all__ = [
    "Diagnosis",
    "Divergence",
    "Dump",
    "Entry",
    "FlightRecorderError",
    "P2PWait",
    "PGStatus",
    "ProcessGroup",
    "UnsafeDumpError",
    "analyze",
    "diagnose",
    "load_dump",
    "load_dumps",
    "parse_dump",
    "render",
]


class FlightRecorderError(ValueError):
    """A dump that cannot be read; the message names the file."""


class UnsafeDumpError(FlightRecorderError):
    """A pickle that asks for a global (a class or a function): refused, never executed."""


class _DataOnlyUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, str, bytes, int, float, bool and None; nothing else.

    Every way a pickle can reach code (GLOBAL/STACK_GLOBAL, the copyreg extension codes,
    persistent ids) goes through ``find_class`` or ``persistent_load``, and both refuse.
    """

    def __init__(self, data: bytes, source: str) -> None:
        super().__init__(io.BytesIO(data))
        self._source = source

    def find_class(self, module: str, name: str) -> Any:
        raise UnsafeDumpError(
            f"{self._source}: refused to load global {module}.{name}: a Flight Recorder dump "
            "holds plain values only, so this file is not one (or was tampered with)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeDumpError(f"{self._source}: refused persistent id {pid!r}")


@dataclass(frozen=True)
class ProcessGroup:
    name: str
    desc: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class PGStatus:
    last_enqueued: int
    last_started: int
    last_completed: int


_P2P = re.compile(r"\b(send|recv)\s+(\d+)\s*(?:->|<-)\s*(\d+)")


@dataclass(frozen=True)
class Entry:
    """One operation of a rank's ring buffer. ``op`` is the profiling name (``nccl:all_reduce``).

    For a p2p op ``collective_seq_id`` is the number of collectives the rank had issued on the
    group before it, so ``collective_seq_id >= s`` always means "entered collective ``s``".
    """

    record_id: int
    pg_name: str
    pg_desc: str
    pg_id: int
    collective_seq_id: int
    p2p_seq_id: int
    op: str
    is_p2p: bool
    state: str
    retired: bool
    time_created_ns: int | None
    input_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    timeout_ms: int | None

    @property
    def pending(self) -> bool:
        return self.state != "completed" and not self.retired

    def p2p_peer(self, group: ProcessGroup | None) -> tuple[str, int] | None:
        """("send" | "recv", global rank of the peer), from ``nccl:send 0->1`` (group ranks)."""
        m = _P2P.search(self.op)
        if m is None:
            return None
        local = int(m.group(3))
        if group is None or local >= len(group.ranks):
            return None
        return m.group(1), group.ranks[local]


@dataclass(frozen=True)
class Dump:
    """One rank's dump. ``status`` is keyed by process group name (see ``parse_dump``)."""

    rank: int
    source: str
    version: str
    groups: Mapping[str, ProcessGroup]
    status: Mapping[str, PGStatus]
    entries: tuple[Entry, ...]


# ---------------------------------------------------------------------------------------------
# Reading


def _fail(source: str, what: str) -> FlightRecorderError:
    return FlightRecorderError(f"{source}: {what}")


def _int(rec: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    v = rec.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        if v is None and default is not None:
            return default
        raise FlightRecorderError(f"{where}: field {key!r} should be an integer, not {v!r}")
    return v


def _opt_int(rec: Mapping[str, Any], key: str, where: str) -> int | None:
    v = rec.get(key)
    return None if v is None else _int(rec, key, where)


def _sizes(v: Any, where: str) -> tuple[tuple[int, ...], ...]:
    if v is None:
        return ()
    try:
        return tuple(tuple(int(x) for x in shape) for shape in v)
    except (TypeError, ValueError) as exc:
        raise FlightRecorderError(f"{where}: field 'input_sizes' is malformed ({exc})") from exc


def _entry(e: Any, where: str) -> Entry:
    if not isinstance(e, Mapping):
        raise FlightRecorderError(f"{where}: should be a dict, not {type(e).__name__}")
    pg = e.get("process_group")
    if not isinstance(pg, list | tuple) or len(pg) < 2:
        raise FlightRecorderError(f"{where}: field 'process_group' should be (name, desc)")
    op = e.get("profiling_name")
    state = e.get("state")
    if not isinstance(op, str) or not isinstance(state, str):
        raise FlightRecorderError(f"{where}: fields 'profiling_name' and 'state' are required")
    is_p2p = e.get("is_p2p")
    dtypes = e.get("input_dtypes") or ()
    return Entry(
        record_id=_int(e, "record_id", where, default=-1),
        pg_name=str(pg[0]),
        pg_desc=str(pg[1]),
        pg_id=_int(e, "pg_id", where, default=-1),
        collective_seq_id=_int(e, "collective_seq_id", where),
        p2p_seq_id=_int(e, "p2p_seq_id", where, default=0),
        op=op,
        is_p2p=bool(is_p2p) if is_p2p is not None else _P2P.search(op) is not None,
        state=state,
        retired=bool(e.get("retired", False)),
        time_created_ns=_opt_int(e, "time_created_ns", where),
        input_sizes=_sizes(e.get("input_sizes"), where),
        input_dtypes=tuple(str(d) for d in dtypes),
        timeout_ms=_opt_int(e, "timeout_ms", where),
    )


def _ranks(v: Any, where: str) -> tuple[int, ...]:
    if isinstance(v, str):  # the dumps store "[0, 8]"
        try:
            v = json.loads(v)
        except json.JSONDecodeError as exc:
            raise FlightRecorderError(f"{where}: 'ranks' is not a list: {v!r}") from exc
    if not isinstance(v, list | tuple) or not all(
        isinstance(r, int) and not isinstance(r, bool) for r in v
    ):
        raise FlightRecorderError(f"{where}: 'ranks' is not a list of integers: {v!r}")
    return tuple(v)


def _status_by_name(
    pg_names: Iterable[str], raw_status: Mapping[str, PGStatus], exact: Mapping[str, int]
) -> dict[str, PGStatus]:
    """``pg_status`` is keyed by local pg id. Entries pin some ids to names; the rest follow if
    names are numeric (Megatron-style creation counters): the k-th oldest group has the k-th
    smallest local id. Used for evidence only."""
    by_id = {int(k): v for k, v in raw_status.items() if k.lstrip("-").isdigit()}
    mapping = dict(exact)
    names = list(pg_names)
    if all(n.isdigit() for n in names) and len(names) == len(by_id):
        zipped = dict(zip(sorted(names, key=int), sorted(by_id), strict=True))
        if all(zipped.get(n) == i for n, i in exact.items()):
            mapping = zipped
    return {n: by_id[i] for n, i in mapping.items() if i in by_id}


def parse_dump(data: bytes, *, rank: int | None = None, source: str = "<bytes>") -> Dump:
    """Parse one dump (pickle or JSON) without running anything it contains."""
    if data.lstrip()[:1] == b"{":
        try:
            raw: Any = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _fail(source, f"truncated or corrupt JSON dump ({exc})") from exc
    else:
        try:
            raw = _DataOnlyUnpickler(data, source).load()
        except FlightRecorderError:
            raise
        except Exception as exc:  # a corrupt pickle can fail in many ways
            raise _fail(source, f"truncated or corrupt dump ({type(exc).__name__}: {exc})") from exc
    if not isinstance(raw, Mapping):
        raise _fail(source, f"a dump is a dict, this is a {type(raw).__name__}")
    if not isinstance(raw.get("entries"), list):
        raise _fail(source, "no 'entries' list: not a Flight Recorder dump")
    inner = raw.get("rank")
    if inner is not None and rank is not None and inner != rank:
        raise _fail(source, f"the file name says rank {rank}, the dump says rank {inner}")
    rank = inner if isinstance(inner, int) else rank
    if rank is None:
        raise _fail(source, "unknown rank: name the file *_<rank> or pass rank=")

    groups: dict[str, ProcessGroup] = {}
    for name, cfg in (raw.get("pg_config") or {}).items():
        where = f"{source}: pg_config[{name!r}]"
        if not isinstance(cfg, Mapping):
            raise FlightRecorderError(f"{where}: should be a dict")
        groups[str(name)] = ProcessGroup(
            name=str(name), desc=str(cfg.get("desc", "")), ranks=_ranks(cfg.get("ranks"), where)
        )
    entries = tuple(_entry(e, f"{source}: entries[{i}]") for i, e in enumerate(raw["entries"]))
    raw_status: dict[str, PGStatus] = {}
    for pg_id, st in (raw.get("pg_status") or {}).items():
        where = f"{source}: pg_status[{pg_id!r}]"
        if not isinstance(st, Mapping):
            raise FlightRecorderError(f"{where}: should be a dict")
        raw_status[str(pg_id)] = PGStatus(
            last_enqueued=_int(st, "last_enqueued_collective", where, default=-1),
            last_started=_int(st, "last_started_collective", where, default=-1),
            last_completed=_int(st, "last_completed_collective", where, default=-1),
        )
    exact = {e.pg_name: e.pg_id for e in entries if e.pg_id >= 0}
    return Dump(
        rank=rank,
        source=source,
        version=str(raw.get("version", "")),
        groups=groups,
        status=_status_by_name(groups, raw_status, exact),
        entries=entries,
    )


_RANK_IN_NAME = re.compile(r"_(\d+)(?:\.(?:pkl|pickle|json))?$")


def load_dump(path: str | Path, rank: int | None = None) -> Dump:
    """Read one dump; the rank comes from ``rank``, the dump, or a name ending ``_<rank>``."""
    p = Path(path)
    if rank is None and (m := _RANK_IN_NAME.search(p.name)):
        rank = int(m.group(1))
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise _fail(str(p), f"cannot read ({exc.strerror or exc})") from exc
    return parse_dump(data, rank=rank, source=str(p))


def load_dumps(directory: str | Path) -> list[Dump]:
    """Every file in ``directory`` named ``*_<rank>`` (``.pkl``/``.json`` allowed), by rank."""
    d = Path(directory)
    if not d.is_dir():
        raise _fail(str(d), "not a directory")
    files = sorted(p for p in d.iterdir() if p.is_file() and _RANK_IN_NAME.search(p.name))
    if not files:
        raise _fail(str(d), "no Flight Recorder dumps (files named *_<rank>)")
    dumps = [load_dump(p) for p in files]
    seen: dict[int, str] = {}
    for dump in dumps:
        if dump.rank in seen:
            raise _fail(dump.source, f"rank {dump.rank} again (also in {seen[dump.rank]})")
        seen[dump.rank] = dump.source
    return sorted(dumps, key=lambda x: x.rank)


# ---------------------------------------------------------------------------------------------
# Analysis


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


def diagnose(dumps: Iterable[Dump]) -> Diagnosis:
    """Match operations across ranks per process group and name the culprits."""
    by_rank: dict[int, Dump] = {}
    for d in dumps:
        if d.rank in by_rank:
            raise _fail(d.source, f"rank {d.rank} again (also in {by_rank[d.rank].source})")
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
    no_dump: set[int] = set()
    for name, ranks_entries in per_group.items():
        group = groups.get(name)
        desc = group.desc if group else next(iter(ranks_entries.values()))[0].pg_desc
        members = group.ranks if group else tuple(sorted(ranks_entries))
        pending = [e for es in ranks_entries.values() for e in es if e.pending and not e.is_p2p]
        if pending:
            seq = min(e.collective_seq_id for e in pending)
            at = {
                r: e
                for r, es in ranks_entries.items()
                for e in es
                if e.pending and not e.is_p2p and e.collective_seq_id == seq
            }
            issued = {r: max(e.collective_seq_id for e in es) for r, es in ranks_entries.items()}
            missing = tuple(m for m in members if m not in at and issued.get(m, -1) < seq)
            if missing:
                no_dump |= {m for m in missing if m not in by_rank}
                waiting = tuple(sorted(at))
                sample = at[waiting[0]]
                times = [e.time_created_ns for e in at.values() if e.time_created_ns is not None]
                divergences.append(
                    Divergence(
                        pg_name=name,
                        pg_desc=desc,
                        seq=seq,
                        op=_first(Counter(e.op for e in at.values())),
                        input_sizes=sample.input_sizes,
                        input_dtypes=sample.input_dtypes,
                        members=members,
                        waiting=waiting,
                        missing=missing,
                        blocked=tuple(r for r in waiting if _is_at(oldest.get(r), name, seq)),
                        entered_ns=min(times) if times else None,
                    )
                )
        # Point-to-point: count what each side posted for each (from, to) pair.
        posted: Counter[tuple[str, int, int]] = Counter()
        for r, es in ranks_entries.items():
            for e in es:
                peer = e.p2p_peer(group) if e.pending and e.is_p2p else None
                if peer is not None:
                    posted[(peer[0], r, peer[1])] += 1
        for (kind, r, to), n in posted.items():
            other = "recv" if kind == "send" else "send"
            short = n - posted.get((other, to, r), 0)
            if short > 0:
                p2p.append(P2PWait(r, to, kind, name, desc, short))
                if to not in by_rank:
                    no_dump.add(to)

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
    return text + ", which no member is missing (suspect the network or a GPU)"


def analyze(dumps: Iterable[Dump]) -> list[Finding]:
    """One ``hang`` finding naming the culprits, or nothing when no rank waits for another."""
    dg = diagnose(dumps)
    if not dg.culprits:
        return []
    ev: dict[str, Any] = {"source": "flight_recorder"}
    if dg.divergences:
        top = dg.divergences[0]
        ev.update(top.as_dict())
        key = f"hang:fr:pg={top.pg_name}:seq={top.seq}"
        what = (
            f"{top.op} seq {top.seq} ({_size_text(top)} {'/'.join(top.input_dtypes)}) on pg "
            f"{top.pg_name} {top.pg_desc}, where {len(top.waiting)} ranks wait"
        )
        verb = "never entered"
    else:
        pw = next(w for w in dg.p2p_waits if w.peer in dg.culprits)
        key = f"hang:fr:p2p={pw.rank}->{pw.peer}"
        what = f"the {pw.kind} of rank {pw.rank} on pg {pw.pg_name} {pw.pg_desc}"
        verb = "never matched"
    word = "rank" if len(dg.culprits) == 1 else "ranks"
    summary = (
        f"{word} {', '.join(map(str, dg.culprits))} {verb} {what}; "
        f"{len(dg.held_up)} of {len(dg.ranks)} ranks are held up"
    )
    ev.update(
        {
            "culprit_reasons": {str(r): t for r, t in dg.reasons.items()},
            "process_groups": [dv.as_dict() for dv in dg.divergences[:_MAX_EVIDENCE]],
            "process_groups_total": len(dg.divergences),
            "p2p_waits": [
                {"rank": w.rank, "peer": w.peer, "op": w.kind, "pg": w.pg_name, "count": w.count}
                for w in dg.p2p_waits[:_MAX_EVIDENCE]
            ],
            "p2p_waits_total": len(dg.p2p_waits),
            "held_up_ranks": list(dg.held_up),
            "ranks_with_dumps": len(dg.ranks),
            "no_dump_ranks": list(dg.no_dump),
            "versions": list(dg.versions),
        }
    )
    return [
        Finding(
            kind="hang",
            severity="critical",
            ranks=dg.culprits,
            first_step=None,
            score=float(len(dg.held_up)),
            summary=summary,
            key=key,
            evidence=ev,
        )
    ]


# ---------------------------------------------------------------------------------------------
# Text


def _size_text(dv: Divergence) -> str:
    return ", ".join("x".join(map(str, s)) for s in dv.input_sizes) or "-"


def _span(ranks: Iterable[int]) -> str:
    """[8, 10, 11, 12, 15] -> "8,10-12,15"."""
    out: list[str] = []
    rs = sorted(ranks)
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(out) or "-"


_MAX_LINES = 20
_MAX_EVIDENCE = 100


def render(dg: Diagnosis) -> str:
    """A plain-text report: culprits, then one row per diverging process group."""
    lines = [
        f"Flight Recorder: {len(dg.ranks)} dumps (ranks {_span(dg.ranks)}), "
        f"version {', '.join(dg.versions) or '?'}"
    ]
    if not dg.culprits:
        lines.append("No rank waits for another: every pending collective has all its members.")
        return "\n".join(lines)
    lines.append(f"Culprit ranks: {', '.join(map(str, dg.culprits))}")
    reasons = list(dg.reasons.items())
    for r, text in reasons[:_MAX_LINES]:
        lines.append(f"  rank {r}: {text}")
    if len(reasons) > _MAX_LINES:
        lines.append(f"  ... and {len(reasons) - _MAX_LINES} more")
    lines.append(f"Held up: {len(dg.held_up)} ranks ({_span(dg.held_up)})")
    if dg.no_dump:
        lines.append(f"No dump from: {_span(dg.no_dump)}")
    if dg.divergences:
        head = ("PG", "Process Group Desc", "Op", "Seq", "Size", "Dtype", "Waiting", "Missing")
        rows = [
            (
                dv.pg_name + ("*" if i == 0 else ""),
                dv.pg_desc,
                dv.op,
                str(dv.seq),
                _size_text(dv),
                ",".join(dv.input_dtypes) or "-",
                _span(dv.waiting),
                _span(dv.missing),
            )
            for i, dv in enumerate(dg.divergences[:_MAX_LINES])
        ]
        widths = [max(len(c) for c in col) for col in zip(head, *rows, strict=True)]
        lines.append("")
        for row in (head, *rows):
            lines.append(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if len(dg.divergences) > _MAX_LINES:
            lines.append(f"... and {len(dg.divergences) - _MAX_LINES} more process groups")
        lines.append("* the collective the job waits in: most ranks are blocked in it first")
    if dg.p2p_waits:
        pairs: dict[tuple[int, int], list[str]] = defaultdict(list)
        for w in dg.p2p_waits:
            pairs[(w.rank, w.peer)].append(f"{w.count} {w.kind} on pg {w.pg_name}")
        lines.append("")
        lines.append("Unmatched point-to-point ops (rank -> peer it waits for):")
        for (r, peer), ops in list(pairs.items())[:_MAX_LINES]:
            lines.append(f"  {r} -> {peer}: {', '.join(ops)}")
        if len(pairs) > _MAX_LINES:
            lines.append(f"  ... and {len(pairs) - _MAX_LINES} more pairs")
    return "\n".join(lines)

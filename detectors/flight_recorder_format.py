"""The PyTorch Flight Recorder dump format: bytes in, a validated ``Dump`` out.

A dump (``TORCH_NCCL_TRACE_BUFFER_SIZE`` > 0, written at a watchdog timeout or on demand) is a
pickle of plain Python values: ``version``, ``pg_config`` (process group name -> desc, ranks),
``pg_status`` (local pg id -> last enqueued/started/completed seq) and ``entries``, the ring
buffer of NCCL operations with ``pg_id``, ``process_group`` (name, desc), ``collective_seq_id``,
``p2p_seq_id``, ``profiling_name``, ``input_sizes``, ``input_dtypes``, ``state``
(scheduled/started/completed), ``time_created_ns``, ... JSON dumps with the same fields are
read too. Pickles are read with an unpickler that refuses every global (dumps contain none), so
a crafted file cannot run code: it raises ``UnsafeDumpError``. Anything else unreadable raises
``FlightRecorderError`` (a ``ValueError``) naming the ``source``.

    >>> import pickle
    >>> raw = {"version": "2.9", "pg_config": {"0": {"desc": "default_pg", "ranks": "[0, 1]"}},
    ...        "entries": [{"process_group": ("0", "default_pg"), "collective_seq_id": 3,
    ...                     "profiling_name": "nccl:all_reduce", "state": "scheduled"}]}
    >>> dump = parse_dump(pickle.dumps(raw), rank=1, source="trace_1")
    >>> dump.rank, dump.groups["0"].ranks, dump.entries[0].op, dump.entries[0].pending
    (1, (0, 1), 'nccl:all_reduce', True)
    >>> try:
    ...     parse_dump(pickle.dumps(print), rank=0, source="evil_0")
    ... except UnsafeDumpError as exc:
    ...     print(exc)
    evil_0: refused to load global builtins.print: a Flight Recorder dump holds plain values ...

Reading files is not done here (``detectors`` is pure): ``backend.importers.flight_recorder``
reads a directory of dumps and calls :func:`parse_dump` on each file's bytes.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Dump",
    "Entry",
    "FlightRecorderError",
    "PGStatus",
    "ProcessGroup",
    "UnsafeDumpError",
    "decode_dump",
    "parse_dump",
    "read_dump",
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
    if not isinstance(dtypes, list | tuple):
        raise FlightRecorderError(f"{where}: field 'input_dtypes' should be a list")
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


def decode_dump(data: bytes, *, source: str = "<bytes>") -> Any:
    """A dump's bytes (pickle or JSON) as plain values, without running anything they hold."""
    if data.lstrip()[:1] == b"{":
        try:
            return json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _fail(source, f"truncated or corrupt JSON dump ({exc})") from exc
    try:
        return _DataOnlyUnpickler(data, source).load()
    except FlightRecorderError:
        raise
    except Exception as exc:  # a corrupt pickle can fail in many ways
        raise _fail(source, f"truncated or corrupt dump ({type(exc).__name__}: {exc})") from exc


def parse_dump(data: bytes, *, rank: int | None = None, source: str = "<bytes>") -> Dump:
    """Parse one dump (pickle or JSON) without running anything it contains.

    The rank is the dump's own ``rank`` field or, failing that, ``rank``; both given and
    different is an error. ``source`` (a file name) starts every error message.
    """
    return read_dump(decode_dump(data, source=source), rank=rank, source=source)


def read_dump(raw: Any, *, rank: int | None = None, source: str = "<dump>") -> Dump:
    """A decoded dump (plain values: a dict with ``entries``, ``pg_config``, ...) checked and
    read into a ``Dump``; the rules of :func:`parse_dump`. A JSON copy of a pickled dump reads
    the same (tuples become lists, integer keys strings)."""
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

    for key in ("pg_config", "pg_status"):
        if not isinstance(raw.get(key) or {}, Mapping):
            raise _fail(source, f"{key!r} should be a dict")
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

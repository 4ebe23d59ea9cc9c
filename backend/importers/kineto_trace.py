"""One rank's PyTorch profiler (Kineto) trace, read into what Vigil stores per iteration.

    trace = read_trace("rank-3.json.gz")            # .json or .json.gz; rank 3
    for it in trace.iterations:                      # one per ProfilerStep#N
        it.step, it.duration_s, it.gpu, it.opseq     # gpu: a GpuBreakdown (None on CPU-only)
    trace.collectives                                # per (step, group, op): time, calls, bytes
    trace.opseqs                                     # {fingerprint: ops} of the iterations

- **Iterations** are the ``ProfilerStep#N`` annotations: step ``N``, its wall time on the
  CPU, its end as the step's timestamp (epoch seconds, ``baseTimeNanoseconds`` added where
  the trace has it).
- **GPU breakdown** per iteration as HTA defines it (``kineto_breakdown``); GPU events
  belong to the iteration of the runtime call that launched them (same ``correlation``).
- **Collectives**: NCCL kernels per iteration, named by the kernel's own arguments
  (``Collective name``, ``Process Group …``, newer PyTorch) or the ``nccl:<op>`` annotation
  around their launch, else by the kernel name; the group is the process group
  (``"world"`` for the default one, as the collector labels it) or, in traces without
  group names, the CUDA stream. A trace without GPU events (CPU, gloo) takes its collectives
  from the backend's annotations (``gloo:all_reduce``), which span the collective itself.
- **Op sequence**: the iteration's CPU operators (``cpu_op``) with their input shapes, the
  step's own thread first, in start order; fingerprinted as the collector fingerprints its
  sampled steps (blake2b of the marshalled list and the op count), at most ``MAX_OPS``.

The file is read one event at a time (``kineto_stream``); what is kept per event is a few
numbers in typed arrays (about 40 bytes an operator, kernel or launch), never the JSON.
"""

from __future__ import annotations

import bisect
import hashlib
import marshal
import math
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from backend.importers.kineto_breakdown import (
    COMM,
    GpuBreakdown,
    gpu_breakdown,
    kernel_type,
    length,
)
from backend.importers.kineto_comms import (
    CPU_BACKENDS,
    Collective,
    CommCall,
    CommNames,
    cpu_call,
    kernel_call,
)
from backend.importers.kineto_stream import KinetoError, iter_trace

MAX_OPS = 50_000  # ops kept per sequence, as the collector (the hash covers the count of all)
MAX_RANK = 2**31 - 1
_STEP = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
OP_CATS = frozenset({"cpu_op", "operator"})


@dataclass(frozen=True)
class Iteration:
    step: int
    ts: float  # the step's end, epoch seconds
    duration_s: float  # ProfilerStep#N on the CPU
    gpu: GpuBreakdown | None  # None: no GPU event in the iteration
    comm_s: float | None  # exposed communication (GPU) or time in CPU collectives
    opseq: str | None


@dataclass
class RankTrace:
    rank: int
    world_size: int | None
    source: str
    iterations: list[Iteration]
    collectives: list[Collective]
    opseqs: dict[str, list[Any]]


@dataclass
class _Seen:
    """What is kept of the events, in typed arrays (filled by ``_Reader.event``)."""

    steps: list[tuple[int, float, float, int]] = field(default_factory=list)
    launch_corr: array[int] = field(default_factory=lambda: array("q"))
    launch_ts: array[float] = field(default_factory=lambda: array("d"))
    launch_tid: array[int] = field(default_factory=lambda: array("q"))
    gpu_start: array[float] = field(default_factory=lambda: array("d"))
    gpu_end: array[float] = field(default_factory=lambda: array("d"))
    gpu_corr: array[int] = field(default_factory=lambda: array("q"))
    gpu_kind: array[int] = field(default_factory=lambda: array("b"))
    gpu_stream: array[int] = field(default_factory=lambda: array("q"))
    comm_args: dict[int, CommCall] = field(default_factory=dict)  # by GPU event index
    calls: list[tuple[int, float, float, CommCall]] = field(default_factory=list)  # CPU side
    op_ts: array[float] = field(default_factory=lambda: array("d"))
    op_dur: array[float] = field(default_factory=lambda: array("d"))
    op_tid: array[int] = field(default_factory=lambda: array("q"))
    op_key: array[int] = field(default_factory=lambda: array("q"))
    op_table: dict[bytes, int] = field(default_factory=dict)
    tids: dict[Any, int] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source
        self.seen = _Seen()

    def tid(self, value: Any) -> int:
        key = value if isinstance(value, (int, str)) else repr(value)
        return self.seen.tids.setdefault(key, len(self.seen.tids))

    def times(self, ev: dict[str, Any], index: int) -> tuple[float, float]:
        """The event's start and duration (µs); ``KinetoError`` naming it without them."""
        ts, dur = _number(ev.get("ts")), _number(ev.get("dur", 0))
        if ts is None or dur is None or dur < 0:
            raise KinetoError(
                f"{self.source}: event {index} ({str(ev.get('name'))[:60]!r}) has no valid "
                "'ts'/'dur' (numbers of microseconds, dur >= 0)"
            )
        return ts, dur

    def event(self, ev: Any, index: int) -> None:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            return
        args = ev.get("args")
        args = args if isinstance(args, dict) else {}
        name = str(ev.get("name", ""))
        corr = args.get("correlation")
        s = self.seen
        if "stream" in args and isinstance(corr, int) and corr >= 0:
            if ev.get("cat") == "gpu_user_annotation":
                return
            ts, dur = self.times(ev, index)
            kind = kernel_type(name)
            if kind == COMM:
                s.comm_args[len(s.gpu_start)] = kernel_call(name, args)
            s.gpu_start.append(ts)
            s.gpu_end.append(ts + dur)
            s.gpu_corr.append(corr)
            s.gpu_kind.append(kind)
            s.gpu_stream.append(int(args["stream"]) if isinstance(args["stream"], int) else -1)
            return
        if isinstance(corr, int):
            ts, _ = self.times(ev, index)
            s.launch_corr.append(corr)
            s.launch_ts.append(ts)
            s.launch_tid.append(self.tid(ev.get("tid")))
            return
        if m := _STEP.match(name):
            ts, dur = self.times(ev, index)
            s.steps.append((int(m.group(1)), ts, dur, self.tid(ev.get("tid"))))
            return
        if (call := cpu_call(name, args)) is not None:
            ts, dur = self.times(ev, index)
            s.calls.append((self.tid(ev.get("tid")), ts, ts + dur, call))
        if ev.get("cat") in OP_CATS:
            ts, dur = self.times(ev, index)
            dims = args.get("Input Dims")
            key = marshal.dumps((name, dims if isinstance(dims, list) else []), 2)
            s.op_ts.append(ts)
            s.op_dur.append(dur)
            s.op_tid.append(self.tid(ev.get("tid")))
            s.op_key.append(s.op_table.setdefault(key, len(s.op_table)))


def read_trace(path: str | Path, rank: int | None = None) -> RankTrace:
    """Read ``path``; the rank is ``rank``, else the trace's ``distributedInfo.rank``, else
    a ``rank<N>`` in the file name. ``KinetoError`` names the file and what is wrong."""
    p = Path(path)
    reader = _Reader(str(p))
    for kind, key, value in iter_trace(p):
        if kind == "event":
            reader.event(value, int(key))
        else:
            reader.seen.meta[str(key)] = value
    return _finish(reader.seen, source=str(p), rank=_rank(reader.seen.meta, p, rank))


def _rank(meta: dict[str, Any], path: Path, given: int | None) -> int:
    info = meta.get("distributedInfo")
    found = info.get("rank") if isinstance(info, dict) else None
    if given is None and isinstance(found, int) and not isinstance(found, bool):
        given = found
    if given is None and (m := _RANK_IN_NAME.search(path.name)):
        given = int(m.group(1))
    if given is None:
        raise KinetoError(
            f"{path}: no rank (no distributedInfo.rank, no rank<N> in the name): pass --rank"
        )
    if not 0 <= given <= MAX_RANK:
        raise KinetoError(f"{path}: rank {given} is out of range")
    return given


def world_size(meta: dict[str, Any]) -> int | None:
    info = meta.get("distributedInfo")
    size = info.get("world_size") if isinstance(info, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def _finish(s: _Seen, *, source: str, rank: int) -> RankTrace:
    if not s.steps:
        raise KinetoError(
            f"{source}: no ProfilerStep#N annotations: profile with a torch.profiler schedule "
            "and call prof.step() once per iteration"
        )
    steps = sorted(s.steps, key=lambda x: x[1])
    numbers = [n for n, *_ in steps]
    if len(set(numbers)) != len(numbers):
        twice = min(n for n in numbers if numbers.count(n) > 1)
        raise KinetoError(f"{source}: ProfilerStep#{twice} appears more than once")
    base_us = _base_us(s.meta, source)
    arrays = _Arrays(s, steps)
    names = CommNames(s.meta)
    iterations: list[Iteration] = []
    collectives: list[Collective] = []
    opseqs: dict[str, list[Any]] = {}
    for i, (step, start, dur, tid) in enumerate(steps):
        gpu = arrays.breakdown(i)
        calls = arrays.comm_calls(i, start, start + dur)
        comm_s = gpu.exposed_comm_s if gpu is not None else _cpu_comm_s(calls, dur)
        ops = arrays.ops(start, start + dur, tid)
        fingerprint = _fingerprint(ops) if ops else None
        if fingerprint is not None:
            opseqs.setdefault(fingerprint, ops[:MAX_OPS])
        end_s = (start + dur + base_us) / 1e6
        iterations.append(Iteration(step, end_s, dur / 1e6, gpu, comm_s, fingerprint))
        collectives += names.collectives(step, calls)
    return RankTrace(rank, world_size(s.meta), source, iterations, collectives, opseqs)


def _base_us(meta: dict[str, Any], source: str) -> float:
    base = meta.get("baseTimeNanoseconds", 0)
    if not isinstance(base, int) or isinstance(base, bool) or base < 0:
        raise KinetoError(f"{source}: baseTimeNanoseconds is not a count of nanoseconds")
    return base / 1000.0


def _cpu_comm_s(calls: list[Call], dur_us: float) -> float | None:
    """Time in CPU collectives (their union), at most the step's; ``None`` without any."""
    if not calls:
        return None
    starts = np.array([c[1] for c in calls])
    ends = np.array([c[2] for c in calls])
    return min(length(starts, ends), dur_us) / 1e6


Call = tuple[CommCall, float, float, int | None]


class _Arrays:
    """What was kept, as numpy arrays, and the per-iteration questions asked of it."""

    def __init__(self, s: _Seen, steps: list[tuple[int, float, float, int]]) -> None:
        self.s = s
        self.starts = np.array([x[1] for x in steps])
        self.ends = np.array([x[1] + x[2] for x in steps])
        self.gpu_start = np.asarray(s.gpu_start, dtype=np.float64)
        self.gpu_end = np.asarray(s.gpu_end, dtype=np.float64)
        self.gpu_kind = np.asarray(s.gpu_kind, dtype=np.int8)
        self.gpu_step = self._gpu_steps()
        self.launch_of = {c: j for j, c in enumerate(s.launch_corr)} if s.comm_args else {}
        self.calls = _CallIndex(s.calls)
        self.op_ts = np.asarray(s.op_ts, dtype=np.float64)
        self.op_dur = np.asarray(s.op_dur, dtype=np.float64)
        self.op_tid = np.asarray(s.op_tid, dtype=np.int64)
        self.op_key = np.asarray(s.op_key, dtype=np.int64)
        self.op_table: list[list[Any]] = [[]] * len(s.op_table)
        for key, k in s.op_table.items():
            name, dims = marshal.loads(key)
            self.op_table[k] = [name, dims, 0]  # the collector's format; no saved bytes

    def _gpu_steps(self) -> np.ndarray:
        """The iteration (index into the sorted steps, -1: none) of every GPU event: that of
        the CPU call that launched it, found by ``correlation`` (HTA's rule)."""
        s = self.s
        gcorr = np.asarray(s.gpu_corr, dtype=np.int64)
        if gcorr.size == 0 or not s.launch_corr:
            return np.full(gcorr.size, -1)
        lts = np.asarray(s.launch_ts, dtype=np.float64)
        step = np.searchsorted(self.starts, lts, side="right") - 1
        inside = (step >= 0) & (lts < self.ends[np.maximum(step, 0)])
        step = np.where(inside, step, -1)
        corr = np.asarray(s.launch_corr, dtype=np.int64)
        order = np.argsort(corr, kind="stable")
        corr, step = corr[order], step[order]
        at = np.minimum(np.searchsorted(corr, gcorr), corr.size - 1)
        return np.where(corr[at] == gcorr, step[at], -1)

    def breakdown(self, i: int) -> GpuBreakdown | None:
        mask = self.gpu_step == i
        if not mask.any():
            return None
        return gpu_breakdown(self.gpu_start[mask], self.gpu_end[mask], self.gpu_kind[mask])

    def comm_calls(self, i: int, start: float, end: float) -> list[Call]:
        """``(call, start, end, CPU call index)`` of the iteration's communication: its
        NCCL kernels, or, in a trace without GPU events, the CPU backends' calls in it."""
        s = self.s
        if not s.gpu_corr:
            return [
                (call, a, b, n)
                for n, (_, a, b, call) in enumerate(s.calls)
                if call.backend in CPU_BACKENDS and start <= a < end
            ]
        out: list[Call] = []
        for g in np.flatnonzero(self.gpu_step == i).tolist():
            kernel = s.comm_args.get(g)
            if kernel is None:
                continue
            j = self.launch_of.get(s.gpu_corr[g])
            around = None if j is None else self.calls.around(s.launch_tid[j], s.launch_ts[j])
            cpu = s.calls[around][3] if around is not None else None
            call = kernel.named_by(cpu, stream=s.gpu_stream[g])
            out.append((call, s.gpu_start[g], s.gpu_end[g], around))
        return out

    def ops(self, start: float, end: float, step_tid: int) -> list[list[Any]]:
        """The iteration's operators: the step's thread first, the others in the order of
        their first op; each thread's by start (an enclosing op before those inside it)."""
        inside = np.flatnonzero((self.op_ts >= start) & (self.op_ts < end))
        if inside.size == 0:
            return []
        ts, tid = self.op_ts[inside], self.op_tid[inside]
        first: dict[int, float] = {}
        for t, when in zip(tid.tolist(), ts.tolist(), strict=True):
            first[t] = min(first.get(t, when), when)
        threads = sorted(first, key=lambda t: (t != step_tid, first[t]))
        rank_of = {t: r for r, t in enumerate(threads)}
        thread_rank = np.array([rank_of[t] for t in tid.tolist()])
        order = np.lexsort((-self.op_dur[inside], ts, thread_rank))
        return [self.op_table[k] for k in self.op_key[inside][order].tolist()]


class _CallIndex:
    """CPU-side collective calls (``nccl:all_reduce`` …) per thread, to find the one around
    a kernel's launch."""

    DEPTH = 8  # calls nest this deep at most (a call in a call: record_param_comms in nccl:)

    def __init__(self, calls: list[tuple[int, float, float, CommCall]]) -> None:
        by_tid: dict[int, list[tuple[float, float, int]]] = {}
        for n, (tid, start, end, _) in enumerate(calls):
            by_tid.setdefault(tid, []).append((start, end, n))
        self.by_tid = {tid: sorted(spans) for tid, spans in by_tid.items()}
        self.starts = {tid: [x[0] for x in spans] for tid, spans in self.by_tid.items()}

    def around(self, tid: int, ts: float) -> int | None:
        """The innermost call on ``tid`` running at ``ts`` (the latest to start)."""
        spans = self.by_tid.get(tid)
        if not spans:
            return None
        last = bisect.bisect_right(self.starts[tid], ts) - 1
        for start, end, n in reversed(spans[max(0, last - self.DEPTH + 1) : last + 1]):
            if start <= ts <= end:
                return n
        return None


def _fingerprint(ops: list[list[Any]]) -> str:
    """The collector's fingerprint (``collector/integrations/opseq.py``): 32 hex digits of
    blake2b over the marshalled ops kept, and the count of all."""
    digest = hashlib.blake2b(marshal.dumps(ops[:MAX_OPS], 2), digest_size=16)
    digest.update(b"#%d" % len(ops))
    return digest.hexdigest()

"""Where one iteration's GPU time went, as Holistic Trace Analysis (HTA) defines it.

HTA's temporal breakdown and communication/computation overlap
(``hta.analyzers.breakdown_analysis``, ``communication_analysis``), per iteration:

- **GPU events** of an iteration: kernels, memcpys and memsets (events with a ``stream`` and
  a ``correlation``) whose launching runtime call lies inside ``ProfilerStep#N`` on the CPU.
- **kernel span** (HTA's ``kernel_time``): end of the last event − start of the first.
- **idle**: the span less the union of all the events' intervals (no stream busy).
- **compute**: the union of computation kernels, **comm**: the union of NCCL kernels
  (``^nccl.*Kernel``); memory (``Memcpy``/``Memset``/``dma``) and others are neither.
- **non-compute** = span − compute − idle (communication, memory, other).
- **overlap**: the time an NCCL kernel and a computation kernel run at once; HTA's
  overlap percentage is ``overlap / comm``. **Exposed communication** = comm − overlap: the
  time the GPU does nothing but communicate, what Vigil stores as the step's ``comm_s``.

    # a GEMM at 0-10 µs, an all-reduce at 5-20 µs: span 20, compute 10, comm 15,
    # overlap 5 (33 %), exposed communication 10, idle 0
    gpu_breakdown(np.array([0.0, 5.0]), np.array([10.0, 20.0]), np.array([COMPUTE, COMM]))

Times come in microseconds (the trace's unit) and leave in seconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

# Kernel types, in HTA's order of precedence (``hta.utils.utils.get_kernel_type``).
COMM, MEMORY, COMPUTE, OTHER = 0, 1, 2, 3
_NCCL = re.compile(r"^nccl.*Kernel")
_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")

Floats = npt.NDArray[np.float64]


def kernel_type(name: str) -> int:
    """``COMM``, ``MEMORY``, ``COMPUTE`` or ``OTHER`` for a GPU event's name, as HTA."""
    if _NCCL.match(name):
        return COMM
    if _MEMORY.match(name):
        return MEMORY
    if not _NOT_COMPUTE.match(name):
        return COMPUTE
    return OTHER


@dataclass(frozen=True)
class GpuBreakdown:
    """One iteration's GPU time, in seconds (HTA's definitions, module docstring)."""

    span_s: float
    idle_s: float
    compute_s: float
    non_compute_s: float
    comm_s: float
    overlap_s: float

    @property
    def exposed_comm_s(self) -> float:
        """Communication the GPU does not hide behind computation."""
        return max(0.0, self.comm_s - self.overlap_s)

    @property
    def overlap_pct(self) -> float | None:
        """HTA's ``comp_comm_overlap_pctg``; ``None`` without communication."""
        return 100.0 * self.overlap_s / self.comm_s if self.comm_s > 0 else None


def merge(start: Floats, end: Floats) -> tuple[Floats, Floats]:
    """The union of intervals ``[start, end)`` as disjoint sorted intervals."""
    if start.size == 0:
        return start, end
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    heads = np.flatnonzero(new)
    return s[heads], np.maximum.reduceat(e, heads)


def length(start: Floats, end: Floats) -> float:
    """Total length of the union of the intervals."""
    s, e = merge(start, end)
    return float((e - s).sum())


def overlap(a: tuple[Floats, Floats], b: tuple[Floats, Floats]) -> float:
    """Length of the intersection of two unions of intervals (each already merged)."""
    if a[0].size == 0 or b[0].size == 0:
        return 0.0
    times = np.concatenate([a[0], a[1], b[0], b[1]])
    delta = np.concatenate(
        [np.ones(a[0].size), -np.ones(a[1].size), 2 * np.ones(b[0].size), -2 * np.ones(b[1].size)]
    )
    order = np.argsort(times, kind="stable")
    times, running = times[order], np.cumsum(delta[order])
    both = running[:-1] == 3
    return float((times[1:] - times[:-1])[both].sum())


def gpu_breakdown(start_us: Floats, end_us: Floats, kind: npt.NDArray[np.int8]) -> GpuBreakdown:
    """The breakdown of one iteration's GPU events (``start_us``/``end_us``/``kind``)."""
    span = float(end_us.max() - start_us.min())
    busy = length(start_us, end_us)
    compute = merge(start_us[kind == COMPUTE], end_us[kind == COMPUTE])
    comm = merge(start_us[kind == COMM], end_us[kind == COMM])
    compute_us = float((compute[1] - compute[0]).sum())
    comm_us = float((comm[1] - comm[0]).sum())
    idle = span - busy
    return GpuBreakdown(
        span_s=span / 1e6,
        idle_s=idle / 1e6,
        compute_s=compute_us / 1e6,
        non_compute_s=max(0.0, span - compute_us - idle) / 1e6,
        comm_s=comm_us / 1e6,
        overlap_s=overlap(comm, compute) / 1e6,
    )

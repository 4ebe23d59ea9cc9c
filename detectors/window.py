"""What one detection run sees of a job: typed arrays, built once per run by the backend.

A run fills the parts it has; a detector declares the parts it needs
(:mod:`detectors.registry`) and runs only when they are there:

- ``steps``: the last S steps of the job's current attempt as rank × step arrays, NaN where
  a rank did not report (a *detection run*, after new data arrives), and, when those S
  steps last only seconds, the job's step time over the steps before them
  (:class:`StepHistory`: one value per step, for the slowdown detector's longer view);
- ``collectives``: per-step collective aggregates over those steps (same run);
- ``liveness``: each rank's latest state, the clock and recent step times (a *sweep*, on a
  timer: hangs and crashes show as the absence of data);
- ``serving``: a serving job's per-minute request rollups, per SLO and per replica (a
  *serving run*, after new request records and on a timer: burn rates move with the clock);
- ``opseq``: the shape fingerprint each rank reported at each step of the ``steps`` window,
  and what the job knows of those fingerprints (same run).

    >>> import numpy as np
    >>> steps = StepWindow.from_arrays(steps=[10, 11], ranks=[0, 1],
    ...                                step_time=[[0.3, 0.3], [0.3, 0.9]])
    >>> steps.world_size, steps.has_comm
    (2, False)
    >>> Window(steps=steps).parts
    frozenset({'steps'})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from detectors.arrays import sample_rows

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]

PARTS = ("steps", "collectives", "liveness", "serving", "opseq")
# Ranks a StepHistory averages over: the first and the last of the window's. Every rank of a
# synchronous job shares the step time; each rank costs the store a row per step read.
HISTORY_RANKS = 2


# Point-to-point ops as the collector names them (``collector.integrations.torch_distributed``).
P2P_OPS = frozenset(
    {"send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list"}
)


@dataclass(frozen=True)
class Inflight:
    """The operation a rank is blocked in: the oldest it has not finished.

    ``since`` is when the rank entered it (wall-clock seconds). ``peers``: for a
    point-to-point op (send/recv, a batch of them), the global ranks on the other side whose
    transfer has not finished, ``()`` when unknown (a receive from any source, a collector
    that did not say); ``None`` for a collective.
    """

    group: str
    op: str
    seq: int
    since: float
    peers: tuple[int, ...] | None = None

    @property
    def p2p(self) -> bool:
        """A point-to-point op (by its peers, or by its name from collectors without them)."""
        return self.peers is not None or self.op in P2P_OPS


@dataclass(frozen=True)
class RankState:
    """The latest the backend knows of one rank.

    ``last_step`` is the last step the rank finished, at ``last_step_ts``; ``current_step`` the
    step its latest heartbeat says it is in (``None``: ``last_step + 1``).
    ``last_heartbeat_ts`` is the latest time anything arrived from the rank.
    ``host``: the node it runs on, when known (ranks of a failed node die together).
    """

    rank: int
    last_step: int | None
    current_step: int | None
    last_step_ts: float | None
    last_heartbeat_ts: float
    inflight: Inflight | None = None
    host: str | None = None

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


def _grid(values: npt.ArrayLike | None, shape: tuple[int, int]) -> FloatArray:
    if values is None:
        return np.full(shape, np.nan)
    out = np.asarray(values, dtype=np.float64)
    if out.shape != shape:
        raise ValueError(f"expected a {shape} rank × step array, got {out.shape}")
    return out


@dataclass(frozen=True)
class StepHistory:
    """The job's step time over the steps before a :class:`StepWindow`, one value per step.

    ``(H,)`` arrays: at each step the mean over at most ``HISTORY_RANKS`` evenly spaced ranks
    of the window of the step time and of its time in collectives and in the data loader (a
    component a rank did not measure counts as 0, as in :mod:`detectors.timing`); NaN step
    time where none of those ranks reported the step. In synchronous training every rank
    shares the step time, so a few ranks give it at any job size, and H steps cost O(H),
    not O(ranks × H). The backend computes it in SQL (``backend.detection.history``);
    :meth:`from_arrays` is the same computation over arrays (replays, tests).

        >>> h = StepHistory.from_arrays(steps=[3, 4], step_time=[[0.5, 0.25], [1.0, np.nan]],
        ...                             comm_time=[[0.125, np.nan], [0.25, 0.5]])
        >>> h.step_time.tolist(), h.comm_time.tolist(), h.data_time.tolist()
        ([0.75, 0.25], [0.1875, 0.0], [0.0, 0.0])
    """

    steps: IntArray  # (H,) ascending, all before the window's first step
    step_time: FloatArray  # (H,) seconds
    comm_time: FloatArray
    data_time: FloatArray

    @classmethod
    def from_arrays(
        cls,
        *,
        steps: npt.ArrayLike,
        step_time: npt.ArrayLike,
        comm_time: npt.ArrayLike | None = None,
        data_time: npt.ArrayLike | None = None,
        max_ranks: int = HISTORY_RANKS,
    ) -> StepHistory:
        """From rank × step arrays (rows: the window's ranks, in order), as the store does."""
        step_ids = np.asarray(steps, dtype=np.int64).reshape(-1)
        step = np.atleast_2d(np.asarray(step_time, dtype=np.float64))
        shape = (step.shape[0], step.shape[1])
        rows = sample_rows(shape[0], max_ranks)
        sent = np.isfinite(step[rows])
        n = sent.sum(axis=0)

        def mean(values: npt.ArrayLike | None) -> FloatArray:
            grid = np.zeros(shape) if values is None else _grid(values, shape)
            total = np.where(sent, np.nan_to_num(grid[rows], nan=0.0), 0.0).sum(axis=0)
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.asarray(np.where(n > 0, total / n, np.nan), dtype=np.float64)

        return cls(
            steps=step_ids,
            step_time=mean(step),
            comm_time=np.nan_to_num(mean(comm_time), nan=0.0),
            data_time=np.nan_to_num(mean(data_time), nan=0.0),
        )


@dataclass(frozen=True)
class StepWindow:
    """Rank × step arrays of the job's recent steps (rows: ``ranks``, columns: ``steps``)."""

    steps: IntArray  # (S,)
    ranks: IntArray  # (R,)
    step_time: FloatArray  # (R, S) seconds
    comm_time: FloatArray  # time waiting in collectives
    data_time: FloatArray  # time waiting for the data loader
    loss: FloatArray
    grad_norm: FloatArray
    mem_bytes: FloatArray  # peak device memory (or process RSS) per step
    # A NaN loss is data; a missing one is not. These say which cells were sent.
    loss_reported: BoolArray
    grad_reported: BoolArray
    world_size: int
    # Device memory per rank, (R,) bytes; None until ranks report it.
    mem_capacity: FloatArray | None = None
    # Each rank's normal compute ratio to the fast ranks, (R,), NaN where not yet known: kept
    # by the backend across windows (``backend.detection.baselines``); None: estimate anew.
    straggler_baseline: FloatArray | None = None
    # Per rank, the step its open straggler incident names it from, (R,), NaN where it has
    # none: the backend's (``backend.detection.baselines.attach_named``); None: none.
    straggler_since: FloatArray | None = None
    # The job's step time before ``steps`` (None: not loaded; the window is all there is).
    history: StepHistory | None = None
    # Whether the attempt has steps before ``steps`` (the loader kept only its last ones):
    # a condition present from the first column may then have begun before the window.
    older_steps: bool = False

    @property
    def has_comm(self) -> bool:
        return bool(np.isfinite(self.comm_time).any())

    @classmethod
    def from_arrays(
        cls,
        *,
        steps: npt.ArrayLike,
        ranks: npt.ArrayLike,
        step_time: npt.ArrayLike,
        comm_time: npt.ArrayLike | None = None,
        data_time: npt.ArrayLike | None = None,
        loss: npt.ArrayLike | None = None,
        grad_norm: npt.ArrayLike | None = None,
        mem_bytes: npt.ArrayLike | None = None,
        world_size: int | None = None,
        mem_capacity: npt.ArrayLike | None = None,
    ) -> StepWindow:
        """Build a window from plain arrays (tests, replays); missing series are NaN."""
        step_ids = np.asarray(steps, dtype=np.int64).reshape(-1)
        rank_ids = np.asarray(ranks, dtype=np.int64).reshape(-1)
        shape = (rank_ids.size, step_ids.size)
        loss_grid, grad_grid = _grid(loss, shape), _grid(grad_norm, shape)
        unsent = np.zeros(shape, dtype=bool)
        return cls(
            steps=step_ids,
            ranks=rank_ids,
            step_time=_grid(step_time, shape),
            comm_time=_grid(comm_time, shape),
            data_time=_grid(data_time, shape),
            loss=loss_grid,
            grad_norm=grad_grid,
            mem_bytes=_grid(mem_bytes, shape),
            loss_reported=unsent.copy() if loss is None else ~np.isnan(loss_grid),
            grad_reported=unsent if grad_norm is None else ~np.isnan(grad_grid),
            world_size=world_size
            if world_size is not None
            else int(rank_ids.max()) + 1
            if rank_ids.size
            else 0,
            mem_capacity=None
            if mem_capacity is None
            else np.broadcast_to(np.asarray(mem_capacity, dtype=np.float64), (rank_ids.size,)),
        )


@dataclass(frozen=True)
class CollectiveWindow:
    """Per-step collective aggregates, one entry per (rank, step, group, op)."""

    rank: IntArray
    step: IntArray
    group: np.ndarray[Any, np.dtype[np.str_]]
    op: np.ndarray[Any, np.dtype[np.str_]]
    nbytes: FloatArray
    duration_s: FloatArray
    members: Mapping[str, Sequence[int]]  # process group → its global ranks


@dataclass(frozen=True)
class LivenessWindow:
    """The latest state of every rank that has not said goodbye, at time ``now``."""

    states: Sequence[RankState]
    now: float
    step_durations: FloatArray  # the job's recent step times, to learn the hang timeout
    groups: Mapping[str, Sequence[int]] | None = None
    # Training ranks run until they say goodbye: all falling silent at once is a crash.
    # Serving replicas may be scaled away: all falling silent at once is a stop.
    expect_running: bool = True
    # Ranks of the world that have not reported yet, and when the run was first seen:
    # while a run is starting its picture is not whole (see ``detectors.hang``).
    unreported: tuple[int, ...] = ()
    started_ts: float | None = None
    # Ranks of the run that said goodbye, with when they were last heard from: a rank
    # others wait for that left is named as such, not as one that "sent no state at all".
    exited: Mapping[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SloSeries:
    """One SLO's per-minute counts over the window's minutes: requests judged (finished in
    that minute) and those that met every threshold of the SLO."""

    slo_id: int
    name: str
    objective: float  # e.g. 0.99: the fraction of requests that must be good
    period_s: float  # the SLO period (e.g. 28 days): burn-rate windows scale with it
    total: FloatArray  # (M,)
    good: FloatArray  # (M,)
    # Requests judged and good over the whole SLO period up to now (for the error budget
    # left); None: the budget is computed over the window's minutes only.
    period_total: float | None = None
    period_good: float | None = None


@dataclass(frozen=True)
class ServingWindow:
    """A serving job's recent minutes: columns are consecutive epoch minutes ending at
    ``now_minute`` (the current, partial minute); per-replica arrays are (P, M)."""

    now: float  # seconds since the epoch
    minutes: IntArray  # (M,) epoch minutes (seconds // 60), consecutive
    slos: Sequence[SloSeries]
    replicas: tuple[str, ...]  # (P,)
    requests: FloatArray  # (P, M) requests finished in the minute
    errors: FloatArray  # (P, M) of which errored or were rejected
    ttft_sum: FloatArray  # (P, M) sum of TTFT (s) over requests with a first token
    ttft_n: FloatArray
    tpot_sum: FloatArray  # (P, M) sum of TPOT (s) over requests with ≥ 2 output tokens
    tpot_n: FloatArray
    queue_sum: FloatArray  # (P, M) sum of queue_s over requests that reported it
    queue_n: FloatArray
    arrivals: FloatArray  # (P, M) requests that *arrived* in the minute (of those reported)


@dataclass(frozen=True)
class ShapeInfo:
    """What the job knows of one shape fingerprint: the first step any rank ran it, and,
    once a captured step covered it, its op sequence's hash and that sequence's structure
    (the hash of its op names only); None until then."""

    first_step: int
    opseq: str | None = None
    structure: str | None = None


@dataclass(frozen=True)
class OpSeqWindow:
    """The shape fingerprint (``shape_fp``) each rank ran at each step of the window.

    ``codes[r, s]`` indexes ``fingerprints`` (-1: rank ``ranks[r]`` sent none at step
    ``steps[s]``); ``known`` has the job's record of each of those fingerprints;
    ``job_first_step`` is the earliest ``first_step`` of any fingerprint of the job (None:
    unknown), so the job's very first fingerprints are not taken for a change.

        >>> w = OpSeqWindow.from_grid(steps=[7, 8], ranks=[0], shape_fp=[["a", None]],
        ...                           known={"a": ShapeInfo(first_step=0)})
        >>> w.codes.tolist(), w.fingerprints
        ([[0, -1]], ('a',))
    """

    steps: IntArray  # (S,)
    ranks: IntArray  # (R,)
    codes: IntArray  # (R, S)
    fingerprints: tuple[str, ...]
    known: Mapping[str, ShapeInfo]
    job_first_step: int | None = None

    @classmethod
    def from_grid(
        cls,
        *,
        steps: Sequence[int],
        ranks: Sequence[int],
        shape_fp: Sequence[Sequence[str | None]],
        known: Mapping[str, ShapeInfo],
        job_first_step: int | None = None,
    ) -> OpSeqWindow:
        """Build a window from a rank × step grid of fingerprints (None: not reported)."""
        names = tuple(sorted({fp for row in shape_fp for fp in row if fp is not None}))
        index = {fp: i for i, fp in enumerate(names)}
        codes = np.array(
            [[-1 if fp is None else index[fp] for fp in row] for row in shape_fp], dtype=np.int64
        ).reshape(len(ranks), len(steps))
        if job_first_step is None and known:
            job_first_step = min(info.first_step for info in known.values())
        return cls(
            steps=np.asarray(steps, dtype=np.int64),
            ranks=np.asarray(ranks, dtype=np.int64),
            codes=codes,
            fingerprints=names,
            known=known,
            job_first_step=job_first_step,
        )


@dataclass(frozen=True)
class Window:
    """One run's view of a job; the parts it lacks are None."""

    steps: StepWindow | None = None
    collectives: CollectiveWindow | None = None
    liveness: LivenessWindow | None = None
    serving: ServingWindow | None = None
    opseq: OpSeqWindow | None = None

    @property
    def parts(self) -> frozenset[str]:
        """The parts this window has."""
        return frozenset(p for p in PARTS if getattr(self, p) is not None)

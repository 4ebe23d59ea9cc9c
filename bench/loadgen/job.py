"""One simulated synchronous training job, driven by the wall clock: what each rank would
ship (steps, collective aggregates, heartbeats) and how faults change it. Pure: times in,
event dicts out; no I/O, so the tests check its semantics without a server.

    >>> job = SimJob(Shape(ranks=16, tp=4, step_s=1.0), t0=1000.0)
    >>> job.advance(1003.5)                 # steps 0, 1, 2 have ended; step 3 is running
    3
    >>> [e["type"] for e in job.events(5, 2)]
    ['step', 'collective', 'collective', 'collective']
    >>> job.heartbeat(5, 1003.9)["inflight"]["group"]   # late in step 3: in its dp all-reduce
    'dp-1'

**Topology** (as ``bench/simulate.py`` and a Megatron-style DDP×TP job): tensor-parallel
groups ``tp-g`` of ``tp`` consecutive ranks, data-parallel groups ``dp-j`` of the ranks with
``rank % tp == j``. Each step a rank computes (``compute``, its tensor-parallel all-gathers
and reduce-scatters inside it), then all-reduces its gradient shard in ``dp-j``. With
``tp == 1`` the one group is ``world`` (no member list, as the collector reports it).

**Synchronous timing.** Every rank's step takes the same time: the slowest rank's compute
plus the transfer floor. A rank's ``comm_s`` is its step minus its own compute and data
time, so the straggler (a rank computing ``factor``× longer) waits least and the others wait
longer, and the whole job slows down. Compute has a small deterministic jitter per (rank,
step) so ranks are not identical; it is deliberately quiet (the load run measures the
platform, not the detectors: ``bench/simulate.py`` is the noisy, array-at-once simulator for
detection quality).

**Faults** take effect at wall-clock times (:class:`Fault` in ``bench.loadgen.faults``):
a straggler or NaN from the first step that starts at or after its time; a hang or crash
stops the job at its time: the step then running never ends for anyone. A hung rank keeps
sending heartbeats in no collective; a crashed rank sends nothing more. The others wait:
the culprit's tensor-parallel peers in their group's first all-gather of that step, every
other rank in its data-parallel all-reduce (which waits for those peers), so the culprit is
the end of every wait, as Flight Recorder would show it. A NaN appears in the loss and grad
norm of the named ranks at its first step, and on every rank from the next (the all-reduce
spreads it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from bench.loadgen.faults import Fault

Event = dict[str, Any]


@dataclass(frozen=True)
class Shape:
    """The job's size and timing. Shares are of the nominal step time ``step_s``."""

    ranks: int
    step_s: float = 1.0
    tp: int = 1
    compute_share: float = 0.7  # compute (with its tensor-parallel collectives) per step
    tp_share: float = 0.08  # of which inside tensor-parallel collectives (tp > 1)
    data_s: float = 0.005
    jitter: float = 0.01  # compute varies by up to ±1% per (rank, step)
    layers: int = 32  # one all-gather and one reduce-scatter per layer and step (tp > 1)
    buckets: int = 8  # DDP gradient buckets: all-reduces per step
    grad_bytes: int = 2 * 10**9  # gradients of the whole model (1B parameters, bf16)
    ranks_per_node: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.tp < 1 or self.ranks % self.tp:
            raise ValueError(f"ranks ({self.ranks}) must be a positive multiple of tp ({self.tp})")
        if not 0 < self.step_s <= 3600:
            raise ValueError(f"step_s must be in (0, 3600], not {self.step_s}")

    @property
    def base_compute(self) -> float:
        """A rank's nominal compute: the slowest jitter still fits in ``step_s``."""
        return self.compute_share * self.step_s / (1 + self.jitter)

    @property
    def comm_floor(self) -> float:
        """The data-parallel transfer itself: what the last rank to arrive still spends."""
        return self.step_s - self.data_s - self.compute_share * self.step_s

    @property
    def collectives_per_step(self) -> int:
        return 3 if self.tp > 1 else 1

    def dp_group(self, rank: int) -> tuple[str, list[int] | None]:
        if self.tp == 1:
            return "world", None
        j = rank % self.tp
        return f"dp-{j}", list(range(j, self.ranks, self.tp))

    def tp_group(self, rank: int) -> tuple[str, list[int]]:
        g = rank // self.tp
        return f"tp-{g}", list(range(g * self.tp, (g + 1) * self.tp))

    def host(self, rank: int) -> str:
        return f"node-{rank // self.ranks_per_node}"


@dataclass(frozen=True)
class _Step:
    start: float
    duration: float
    factors: dict[int, float]  # straggler ranks → compute factor, during this step


@dataclass
class _Stall:
    at: float
    step: int
    hung: set[int] = field(default_factory=set)
    crashed: set[int] = field(default_factory=set)


class SimJob:
    """The job's clock: :meth:`advance` ends the steps due by ``now``; :meth:`events` and
    :meth:`heartbeat` say what a rank ships. Steps are kept as (start, duration) only, so
    memory grows by a few dozen bytes per step, whatever the number of ranks."""

    def __init__(self, shape: Shape, *, t0: float, faults: list[Fault] | tuple[Fault, ...] = ()):
        self.shape = shape
        self.t0 = t0
        self.faults = sorted(faults, key=lambda f: f.at_s)
        self._steps: list[_Step] = []
        self._factors: dict[int, float] = {}
        self._nan: tuple[int, frozenset[int]] | None = None  # (first step, ranks)
        self.stall: _Stall | None = None
        self._pending = list(self.faults)  # not yet in effect
        self._open = self._new_step(t0)

    # -- the clock ---------------------------------------------------------------------

    @property
    def completed(self) -> int:
        """Steps ended so far (steps ``0 … completed-1``)."""
        return len(self._steps)

    def advance(self, now: float) -> int:
        """End every step due by ``now`` and apply the faults whose time has come."""
        while True:
            end = self._open.start + self._open.duration
            self._apply_stalls(now, min(now, end))
            if self.stall is not None or end > now:
                return self.completed
            self._steps.append(self._open)
            self._open = self._new_step(self._open.start + self._open.duration)

    def _new_step(self, start: float) -> _Step:
        step = len(self._steps)
        for f in [f for f in self._pending if f.kind in ("straggler", "nan")]:
            if self.t0 + f.at_s <= start:
                self._pending.remove(f)
                if f.kind == "straggler":
                    self._factors = {**self._factors, **dict.fromkeys(f.ranks, f.factor)}
                elif self._nan is None:
                    self._nan = (step, frozenset(f.ranks))
        slowest = max(self._factors.values(), default=1.0)
        compute = self.shape.base_compute * (1 + self.shape.jitter) * max(1.0, slowest)
        duration = compute + self.shape.data_s + self.shape.comm_floor
        return _Step(start, duration, self._factors)

    def _apply_stalls(self, now: float, until: float) -> None:
        """Stop the job for hangs and crashes due by ``until`` (the open step's end, or
        ``now`` if sooner); once it stopped, later ones (a second culprit) join at ``now``."""
        for f in [f for f in self._pending if f.kind in ("hang", "crash")]:
            if self.t0 + f.at_s > (now if self.stall is not None else until):
                continue
            self._pending.remove(f)
            if self.stall is None:
                self.stall = _Stall(at=self.t0 + f.at_s, step=self.completed)
            (self.stall.hung if f.kind == "hang" else self.stall.crashed).update(f.ranks)

    def crashed(self, rank: int) -> bool:
        return self.stall is not None and rank in self.stall.crashed

    # -- what a rank ships --------------------------------------------------------------

    def _compute(self, rank: int, step: int, rec: _Step) -> float:
        u = (hash((self.shape.seed, rank, step)) & 0xFFFF) / 0xFFFF  # deterministic, [0, 1]
        return (
            self.shape.base_compute
            * (1 + self.shape.jitter * (2 * u - 1))
            * rec.factors.get(rank, 1.0)
        )

    def _nan_at(self, rank: int, step: int) -> bool:
        if self._nan is None:
            return False
        first, ranks = self._nan
        return step > first or (step == first and rank in ranks)

    def events(self, rank: int, step: int) -> list[Event]:
        """The step record and collective aggregates ``rank`` ships for ended ``step``."""
        s = self.shape
        rec = self._steps[step]
        compute = self._compute(rank, step, rec)
        comm = rec.duration - compute - s.data_s
        loss = 2.0 + 8.0 / (1.0 + step / 100.0)
        nan = self._nan_at(rank, step)
        out: list[Event] = [
            {
                "type": "step",
                "step": step,
                "ts": rec.start + rec.duration,
                "duration_s": rec.duration,
                "comm_s": comm,
                "data_s": s.data_s,
                "loss": math.nan if nan else loss,
                "grad_norm": math.nan if nan else 1.0,
                "mem_bytes": 60 * 2**30,
                "tokens": 8192,
            }
        ]
        dp, dp_members = s.dp_group(rank)
        dp_comm = comm
        if s.tp > 1:
            tp, tp_members = s.tp_group(rank)
            tp_time = s.tp_share * s.step_s
            dp_comm = comm - tp_time
            shard = s.grad_bytes // s.tp // s.layers
            per_op = 2 * s.layers  # all-gathers and reduce-scatters share the group's seq
            for i, op in enumerate(("all_gather", "reduce_scatter")):
                out.append(
                    {
                        "type": "collective",
                        "step": step,
                        "group": tp,
                        "op": op,
                        "seq": step * per_op + per_op - 1 + i,
                        "bytes": shard * s.layers,
                        "duration_s": tp_time / 2,
                        "count": s.layers,
                        "members": tp_members,
                    }
                )
        coll: Event = {
            "type": "collective",
            "step": step,
            "group": dp,
            "op": "all_reduce",
            "seq": (step + 1) * s.buckets,
            "bytes": s.grad_bytes // s.tp,
            "duration_s": dp_comm,
            "count": s.buckets,
        }
        if dp_members is not None:
            coll["members"] = dp_members
        out.append(coll)
        return out

    def heartbeat(self, rank: int, now: float) -> Event | None:
        """The heartbeat ``rank`` sends at ``now`` (None once it crashed): the step it is in
        and the collective it is inside, if any."""
        if self.crashed(rank):
            return None
        stall = self.stall
        rec = self._open
        step = self.completed
        beat: Event = {"type": "heartbeat", "ts": now, "step": step, "pid": 10_000 + rank}
        culprits = set() if stall is None else stall.hung | stall.crashed
        if rank in culprits:
            return beat  # computing (or stuck) forever: in no collective
        s = self.shape
        entered = rec.start + s.data_s + self._compute(rank, step, rec)
        if stall is not None and s.tp > 1:
            tp, members = s.tp_group(rank)
            if culprits & set(members):  # the culprit never joins this group's next op
                since = rec.start + s.data_s + 0.05 * self._compute(rank, step, rec)
                if now >= since:
                    beat["inflight"] = {
                        "group": tp,
                        "op": "all_gather",
                        "seq": step * 2 * s.layers + 1,
                        "since": since,
                    }
                return beat
        if now >= entered:
            beat["inflight"] = {
                "group": s.dp_group(rank)[0],
                "op": "all_reduce",
                "seq": step * s.buckets + 1,
                "since": entered,
            }
        return beat

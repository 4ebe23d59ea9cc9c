"""A seeded simulator of synchronous data-parallel training, with injected faults and ground truth.

    >>> from bench.simulate import Fault, JobConfig, simulate
    >>> run = simulate(JobConfig(ranks=32, steps=300, seed=1),
    ...                [Fault("straggler", ranks=(5,), onset_step=200, magnitude=1.5)])
    >>> run.step_time.shape, bool((run.step_time == run.step_time[0]).all())
    ((32, 300), True)
    >>> int(run.comm_time[:, 250].argmin())     # the slow rank waits least
    5

The job: ``R = tp × dp`` ranks. Tensor-parallel groups are ``tp`` consecutive ranks
(``tp-g`` = ranks ``g*tp … g*tp+tp-1``), data-parallel groups take one rank of each
(``dp-j`` = ranks ``j, j+tp, j+2tp, …``). Every step, each rank

1. loads its batch (``data``) and computes forward and backward (``compute``);
2. joins its ``tp-g`` all-reduce, which ends when its last member arrives plus the group's
   transfer time;
3. joins its ``dp-j`` all-reduce of the gradients, which ends when its last member arrives
   plus that group's transfer time;
4. joins the world all-reduce of the gradient norm (gradient clipping), a tiny latency-bound
   message that every rank leaves at the same moment.

So the step ends at the same instant for every rank: **step time = max over ranks of
(compute + data) + transfers**, and each rank's time in collectives is
``comm = step - compute - data``: the slowest rank waits least. A member's time inside a
collective is its wait for the members that arrive after it plus the transfer, so the
*minimum* over members is the transfer time (what ``detectors.comm`` relies on).

Noise: per-rank compute jitter (lognormal), a per-step factor shared by all ranks (batch
content), heterogeneous hardware (a few ranks a few percent slower for the whole run),
one-step pauses (garbage collection), lognormal data-loading time, network jitter and short
congestion bursts, loss noise around a decaying curve (Gaussian: the loss of a large global
batch is an average over thousands of sequences; a heavier tail would be a spike by any
definition), and small allocator noise in peak memory. Optionally, synchronous checkpoints:
every ``checkpoint_every`` steps the job pauses ``checkpoint_s`` between two steps (outside
the step timer, every rank writing and in no collective, heartbeats going on).

Faults (:class:`Fault`, the ground truth) and how they show:

=================  =========================================================================
``straggler``      ``ranks`` compute ``magnitude``× slower from ``onset_step`` (for
                   ``duration`` steps; ``None``: to the end)
``slowdown``       the whole job slows by ``magnitude``× of its step time from ``onset_step``,
                   through ``component``: ``compute`` (all ranks), ``comm`` (every transfer)
                   or ``data`` (data loading)
``slow_link``      every transfer of the groups containing ``ranks`` takes ``magnitude``×
``nan``            ``variant="rank"``: the rank's forward pass gives a NaN loss at the onset;
                   the all-reduced gradient norm is NaN on every rank that step, and every
                   loss from the next step on. ``variant="overflow"``: the gradient norm of
                   every rank is Inf at one step (mixed-precision overflow), the loss finite
``loss_spike``     the job's loss jumps by ``magnitude`` (relative) and decays back over
                   ``duration`` steps (time constant)
``memory_leak``    ``ranks``' peak memory grows ``magnitude`` bytes per step
``hang``           the job stops at ``onset_step``. ``variant="idle"``: ``ranks`` never reach a
                   collective (stuck computing or loading data; their heartbeats go on), the
                   others wait in theirs. ``variant="stuck_collective"``: every member of one
                   tp group (``ranks``) entered its all-reduce and it never finishes (a link or
                   GPU); the others wait for them
``crash``          ``ranks`` die together during step ``onset_step`` (one process, or a failed
                   node's ranks): their heartbeats stop; the others block in collectives.
                   ``teardown_s`` set: the launcher kills the survivors that long after the
                   crash (torchrun does; srun/mpirun often do not), without a goodbye
=================  =========================================================================

:func:`rank_states` gives what the backend knows of every rank at a wall-clock time (last
finished step, heartbeat, the collective it is blocked in): the input of
``detectors.hang.detect``. :meth:`Run.families` gives the comm detector's input for a range
of steps, :meth:`Run.groups` the process-group membership.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from detectors.comm import CollectiveFamily
from detectors.hang import Inflight, RankState

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

__all__ = [
    "FAULT_KINDS",
    "FINDING_KIND",
    "Fault",
    "JobConfig",
    "Run",
    "rank_states",
    "simulate",
]

GIB = float(1 << 30)
MIB = float(1 << 20)
OP = "all_reduce"

#: Every fault kind the simulator injects, and the finding kind that reports it.
FINDING_KIND = {
    "straggler": "straggler",
    "slowdown": "slowdown",
    "slow_link": "comm_anomaly",
    "nan": "nan",
    "loss_spike": "loss_spike",
    "memory_leak": "memory_pressure",
    "hang": "hang",
    "crash": "crash",
}
FAULT_KINDS = tuple(FINDING_KIND)
_STOPPING = ("hang", "crash")  # faults after which no step finishes


@dataclass(frozen=True)
class JobConfig:
    """Shape and noise of a simulated job. Times in seconds; all fields have sane defaults.

    ranks must be a multiple of ``tp``. ``step_s`` is the median compute time of a step;
    transfers and data loading are given as fractions of it so that jobs of any speed look
    alike. ``first_step`` is the training step of the first simulated step (a window in the
    middle of a run: the loss curve is already past its steep start).
    """

    ranks: int = 64
    steps: int = 500
    seed: int = 0
    tp: int = 8
    first_step: int = 10_000
    t0: float = 1.7e9  # wall clock of the first step's start

    step_s: float = 0.5
    jitter: float = 0.02  # lognormal sigma of each rank's compute per step
    common_jitter: float = 0.02  # lognormal sigma of a factor shared by all ranks per step
    hetero_frac: float = 0.1  # fraction of ranks on slower hardware ...
    hetero_min: float = 0.01  # ... at least this much slower ...
    hetero_max: float = 0.08  # ... and up to this much, for the whole run
    gc_prob: float = 0.003  # per rank and step: a one-step pause ...
    gc_max: float = 0.5  # ... of up to this fraction of the step

    data_frac: float = 0.04  # median data-loading time / step_s
    data_jitter: float = 0.3  # lognormal sigma of data loading

    tp_frac: float = 0.04  # tp all-reduce transfer / step_s
    dp_frac: float = 0.12  # dp all-reduce transfer / step_s
    world_s: float = 0.001  # the grad-norm all-reduce (latency-bound)
    net_jitter: float = 0.05  # lognormal sigma of transfers
    burst_prob: float = 0.002  # per group and step: a congestion burst starts ...
    burst_max_steps: int = 4  # ... lasting up to this many steps ...
    burst_max: float = 2.0  # ... with transfers up to this many times slower
    tp_bytes: float = 256 * MIB  # bytes per step of a tp group (sum over its calls)
    dp_bytes: float = 1024 * MIB  # bytes per step of a dp group

    loss_floor: float = 1.8
    loss_amp: float = 4.0  # loss = floor + amp * (1 + step / loss_tau) ** -loss_alpha
    loss_tau: float = 500.0
    loss_alpha: float = 0.5
    loss_noise: float = 0.01  # relative std of the job's loss per step
    rank_loss_noise: float = 0.03  # relative std of one rank's micro-batch loss
    grad_norm: float = 1.0
    grad_noise: float = 0.1  # lognormal sigma of the gradient norm

    mem_gib: float = 60.0  # typical peak memory per rank
    mem_spread_gib: float = 2.0  # per-rank spread of that
    mem_noise_mib: float = 64.0  # per-step allocator noise
    capacity_gib: float = 80.0

    heartbeat_s: float = 1.0
    checkpoint_every: int = 0  # steps between synchronous checkpoints (0: none)
    checkpoint_s: float = 30.0  # pause of each checkpoint, between two steps

    def __post_init__(self) -> None:
        if self.ranks < self.tp or self.ranks % self.tp:
            raise ValueError(f"ranks ({self.ranks}) must be a positive multiple of tp ({self.tp})")
        if self.steps < 1 or self.step_s <= 0:
            raise ValueError("need steps >= 1 and step_s > 0")

    @property
    def n_tp_groups(self) -> int:
        return self.ranks // self.tp


@dataclass(frozen=True)
class Fault:
    """One injected fault: the ground truth a detector is scored against.

    ``onset_time`` is filled in by :func:`simulate`: the wall-clock start of ``onset_step``
    (for a crash, the moment the ranks die).
    """

    kind: str
    ranks: tuple[int, ...] = ()
    onset_step: int = 0  # index into the run (0 = the first simulated step)
    duration: int | None = None  # steps; None: until the end of the run
    magnitude: float = 1.0
    component: str | None = None  # slowdown: compute | comm | data
    variant: str | None = None  # nan: rank | overflow; hang: idle | stuck_collective
    teardown_s: float | None = None  # crash: survivors killed this long after the crash
    onset_time: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in FINDING_KIND:
            raise ValueError(f"unknown fault kind {self.kind!r}")

    @property
    def finding_kind(self) -> str:
        return FINDING_KIND[self.kind]

    @property
    def end_step(self) -> int | None:
        """Last affected step index (inclusive), None when it lasts to the end."""
        return None if self.duration is None else self.onset_step + self.duration - 1


@dataclass
class _Stall:
    """Step ``index`` of a hang or crash, which never finishes: per-rank times (relative to
    the step's start) at which each rank reaches each phase; inf where it never does."""

    index: int  # index of the step that never finishes (== number of finished steps)
    start: float  # wall clock of its start
    arrival: FloatArray  # (R,) compute + data done, entering tp
    tp_end: FloatArray  # (R,) leaving tp, entering dp
    dp_end: FloatArray  # (R,) leaving dp, entering world
    death: FloatArray  # (R,) wall clock at which each rank stops sending anything (inf: never)


@dataclass
class Run:
    """A simulated run: per-rank, per-step arrays (ranks × finished steps) and ground truth.

    ``steps`` are training step ids; ``step_start``/``step_end`` wall clock per step.
    ``tp_dur``/``dp_dur`` are every member's seconds in its group's all-reduce per step.
    A hang or crash stops the run: the arrays hold only the steps that finished.
    """

    config: JobConfig
    faults: tuple[Fault, ...]
    steps: IntArray  # (S,)
    step_start: FloatArray  # (S,)
    step_end: FloatArray  # (S,)
    compute: FloatArray  # (R, S)
    data_time: FloatArray  # (R, S)
    comm_time: FloatArray  # (R, S)
    step_time: FloatArray  # (R, S), equal across ranks
    loss: FloatArray  # (R, S)
    grad_norm: FloatArray  # (R, S)
    mem_bytes: FloatArray  # (R, S)
    tp_dur: npt.NDArray[np.float32]  # (G, tp, S)
    dp_dur: npt.NDArray[np.float32]  # (tp, G, S)
    tp_bytes: FloatArray  # (G, S)
    dp_bytes: FloatArray  # (tp, S)
    # Phase times within each finished step, relative to its start: for rank_states.
    arrival: FloatArray  # (R, S)
    tp_end_rel: FloatArray  # (G, S)
    dp_end_rel: FloatArray  # (tp, S)
    hb_phase: FloatArray  # (R,) heartbeat phase in [0, heartbeat_s)
    exit_delay: FloatArray  # (R,) seconds after the end at which each process exits
    stall: _Stall | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n_ranks(self) -> int:
        return self.config.ranks

    @property
    def n_steps(self) -> int:
        return int(self.steps.size)

    @property
    def last_progress(self) -> float:
        """Wall clock of the last finished step's end."""
        return float(self.step_end[-1]) if self.n_steps else self.config.t0

    def groups(self) -> dict[str, list[int]]:
        """Process-group membership, as collectors report it (the world group has none)."""
        tp, g = self.config.tp, self.config.n_tp_groups
        out = {f"tp-{i}": list(range(i * tp, (i + 1) * tp)) for i in range(g)}
        out.update({f"dp-{j}": list(range(j, self.n_ranks, tp)) for j in range(tp)})
        return out

    def families(self, lo: int = 0, hi: int | None = None) -> list[CollectiveFamily]:
        """The tp and dp all-reduce families over step indices ``lo:hi`` (dense arrays)."""
        tp, g = self.config.tp, self.config.n_tp_groups
        sl = slice(lo, hi)
        ranks = np.arange(self.n_ranks)
        return [
            CollectiveFamily(
                kind="tp",
                op=OP,
                group_names=tuple(f"tp-{i}" for i in range(g)),
                members=ranks.reshape(g, tp),
                nbytes=self.tp_bytes[:, sl],
                duration_s=self.tp_dur[:, :, sl],
            ),
            CollectiveFamily(
                kind="dp",
                op=OP,
                group_names=tuple(f"dp-{j}" for j in range(tp)),
                members=ranks.reshape(g, tp).T,
                nbytes=self.dp_bytes[:, sl],
                duration_s=self.dp_dur[:, :, sl],
            ),
        ]

    def capacity_bytes(self) -> float:
        return self.config.capacity_gib * GIB


def simulate(config: JobConfig, faults: Sequence[Fault] = ()) -> Run:
    """Simulate ``config.steps`` steps of the job with ``faults`` injected (seeded)."""
    cfg = config
    rng = np.random.default_rng(cfg.seed)
    r_n, s_n, tp, g_n = cfg.ranks, cfg.steps, cfg.tp, cfg.n_tp_groups
    faults = tuple(faults)
    for f in faults:
        if any(not 0 <= r < r_n for r in f.ranks):
            raise ValueError(f"fault {f.kind} names ranks outside 0..{r_n - 1}")
        if not 0 <= f.onset_step < s_n:
            raise ValueError(f"fault {f.kind} onset {f.onset_step} outside the run")
    steps = cfg.first_step + np.arange(s_n, dtype=np.int64)

    # --- compute and data loading, per rank and step ----------------------------------------
    hetero = np.ones(r_n)
    slow_hw = rng.random(r_n) < cfg.hetero_frac
    hetero[slow_hw] += rng.uniform(cfg.hetero_min, cfg.hetero_max, int(slow_hw.sum()))
    common = np.exp(cfg.common_jitter * rng.standard_normal(s_n))
    compute = cfg.step_s * hetero[:, None] * common[None, :]
    compute = compute * np.exp(cfg.jitter * rng.standard_normal((r_n, s_n)))
    gc = rng.random((r_n, s_n)) < cfg.gc_prob
    compute[gc] *= 1.0 + rng.uniform(0.1, cfg.gc_max, int(gc.sum()))
    data = cfg.data_frac * cfg.step_s * np.exp(cfg.data_jitter * rng.standard_normal((r_n, s_n)))

    # --- transfers, per group and step ------------------------------------------------------
    t_tp = cfg.tp_frac * cfg.step_s * _net_noise(rng, (g_n, s_n), cfg)
    t_dp = cfg.dp_frac * cfg.step_s * _net_noise(rng, (tp, s_n), cfg)
    t_world = cfg.world_s * np.exp(0.1 * rng.standard_normal(s_n))

    for f in faults:
        span = _span(f, s_n)
        if f.kind == "straggler":
            compute[list(f.ranks), span] *= f.magnitude
        elif f.kind == "slowdown":
            # magnitude is the rise of the whole step; put all of it in one component.
            extra = (f.magnitude - 1.0) * cfg.step_s
            if f.component == "compute":
                compute[:, span] *= f.magnitude
            elif f.component == "data":
                data[:, span] += extra * np.exp(0.1 * rng.standard_normal((r_n, _len(span))))
            elif f.component == "comm":
                share = (cfg.tp_frac + cfg.dp_frac) * cfg.step_s
                factor = 1.0 + extra / share
                t_tp[:, span] *= factor
                t_dp[:, span] *= factor
            else:
                raise ValueError(f"slowdown component {f.component!r}")
        elif f.kind == "slow_link":
            for r in f.ranks:
                t_tp[r // tp, span] *= f.magnitude
                t_dp[r % tp, span] *= f.magnitude

    # --- synchronous semantics --------------------------------------------------------------
    arrival = compute + data  # (R, S), relative to the step's start
    by_tp = arrival.reshape(g_n, tp, s_n)
    tp_end = by_tp.max(axis=1) + t_tp  # (G, S): every member leaves tp together
    dp_end = tp_end.max(axis=0)[None, :] + t_dp  # (tp, S): dp-j's last member is the latest tp
    step = dp_end.max(axis=0) + t_world  # (S,): the world all-reduce ends for all at once
    gap = np.zeros(s_n)  # pause before each step: synchronous checkpoints
    if cfg.checkpoint_every > 0:
        gap[cfg.checkpoint_every :: cfg.checkpoint_every] = cfg.checkpoint_s
    step_start = cfg.t0 + np.cumsum(gap) + np.concatenate([[0.0], np.cumsum(step)[:-1]])
    step_end = step_start + step
    step_time = np.broadcast_to(step, (r_n, s_n)).copy()
    comm = step_time - compute - data

    # Each member's seconds inside its collectives (measured with ~0.5% timer noise).
    meas = np.exp(0.005 * rng.standard_normal((g_n, tp, s_n)))
    tp_dur = ((tp_end[:, None, :] - by_tp) * meas).astype(np.float32)  # (G, tp, S)
    meas = np.exp(0.005 * rng.standard_normal((tp, g_n, s_n)))
    dp_dur = ((dp_end[:, None, :] - tp_end[None, :, :]) * meas).astype(np.float32)  # (tp, G, S)
    tp_bytes = np.full((g_n, s_n), cfg.tp_bytes)
    dp_bytes = np.full((tp, s_n), cfg.dp_bytes)

    loss, grad = _numerics(rng, cfg, steps, faults)
    mem = _memory(rng, cfg, faults)

    hb_phase = rng.uniform(0.0, cfg.heartbeat_s, r_n)
    exit_delay = rng.uniform(0.0, 0.5, r_n)
    faults = tuple(
        replace(f, onset_time=float(step_start[f.onset_step])) if f.onset_time is None else f
        for f in faults
    )

    run = Run(
        config=cfg,
        faults=faults,
        steps=steps,
        step_start=step_start,
        step_end=step_end,
        compute=compute,
        data_time=data,
        comm_time=comm,
        step_time=step_time,
        loss=loss,
        grad_norm=grad,
        mem_bytes=mem,
        tp_dur=tp_dur,
        dp_dur=dp_dur,
        tp_bytes=tp_bytes,
        dp_bytes=dp_bytes,
        arrival=arrival,
        tp_end_rel=tp_end,
        dp_end_rel=dp_end,
        hb_phase=hb_phase,
        exit_delay=exit_delay,
    )
    stopping = [f for f in faults if f.kind in _STOPPING]
    if len(stopping) > 1:
        raise ValueError("at most one hang or crash per run")
    if stopping:
        run = _stop(run, stopping[0], rng)
    return run


def _net_noise(rng: np.random.Generator, shape: tuple[int, int], cfg: JobConfig) -> FloatArray:
    """Multiplicative transfer noise: lognormal jitter plus short congestion bursts."""
    noise = np.exp(cfg.net_jitter * rng.standard_normal(shape))
    starts = np.argwhere(rng.random(shape) < cfg.burst_prob)
    for g, s in starts.tolist():
        n = int(rng.integers(1, cfg.burst_max_steps + 1))
        noise[g, s : s + n] *= rng.uniform(1.2, cfg.burst_max)
    return noise


def _span(f: Fault, n_steps: int) -> slice:
    end = n_steps if f.duration is None else min(n_steps, f.onset_step + f.duration)
    return slice(f.onset_step, end)


def _len(span: slice) -> int:
    return int(span.stop - span.start)


def _numerics(
    rng: np.random.Generator, cfg: JobConfig, steps: IntArray, faults: Sequence[Fault]
) -> tuple[FloatArray, FloatArray]:
    """Per-rank loss (job curve × shared batch noise × micro-batch noise) and the
    gradient norm, which is all-reduced: the same on every rank."""
    r_n, s_n = cfg.ranks, steps.size
    curve = cfg.loss_floor + cfg.loss_amp * (1.0 + steps / cfg.loss_tau) ** -cfg.loss_alpha
    job = curve * (1.0 + cfg.loss_noise * rng.standard_normal(s_n))
    grad = cfg.grad_norm * np.exp(cfg.grad_noise * rng.standard_normal(s_n))
    for f in faults:
        if f.kind == "loss_spike":
            k = np.arange(s_n - f.onset_step)
            tau = max(float(f.duration or 1), 0.5)
            bump = f.magnitude * np.exp(-k / tau)
            job[f.onset_step :] *= 1.0 + bump
            grad[f.onset_step :] *= 1.0 + 3.0 * bump
    loss = job[None, :] * (1.0 + cfg.rank_loss_noise * rng.standard_normal((r_n, s_n)))
    grad2 = np.broadcast_to(grad, (r_n, s_n)).copy()
    for f in faults:
        if f.kind != "nan":
            continue
        at = f.onset_step
        if f.variant in (None, "rank"):
            loss[list(f.ranks), at] = np.nan  # the rank's forward pass blows up
            grad2[:, at] = np.nan  # the all-reduce spreads it to every rank's gradient
            loss[:, at + 1 :] = np.nan  # and to every rank's weights
            grad2[:, at + 1 :] = np.nan
        elif f.variant == "overflow":
            grad2[:, at] = np.inf  # mixed-precision overflow: the step is skipped
        else:
            raise ValueError(f"nan variant {f.variant!r}")
    return loss, grad2


def _memory(rng: np.random.Generator, cfg: JobConfig, faults: Sequence[Fault]) -> FloatArray:
    r_n, s_n = cfg.ranks, cfg.steps
    level = (cfg.mem_gib + cfg.mem_spread_gib * rng.uniform(-1, 1, r_n)) * GIB
    mem = level[:, None] + cfg.mem_noise_mib * MIB * rng.standard_normal((r_n, s_n))
    for f in faults:
        if f.kind == "memory_leak":
            grow = f.magnitude * np.arange(1, s_n - f.onset_step + 1)
            mem[list(f.ranks), f.onset_step :] += grow
    cap = cfg.capacity_gib * GIB
    out: FloatArray = np.minimum(mem, cap)
    return out


def _stop(run: Run, f: Fault, rng: np.random.Generator) -> Run:
    """Cut the run at a hang or crash: steps from ``f.onset_step`` on never finish."""
    k = f.onset_step
    cfg = run.config
    tp, g_n, r_n = cfg.tp, cfg.n_tp_groups, cfg.ranks
    start = float(run.step_start[k])
    arrival = run.arrival[:, k].copy()
    t_tp = run.tp_end_rel[:, k] - run.arrival[:, k].reshape(g_n, tp).max(axis=1)
    t_dp = run.dp_end_rel[:, k] - run.tp_end_rel[:, k].max()
    death = np.full(r_n, np.inf)
    culprits = list(f.ranks)
    stuck_groups: set[int] = set()
    onset_time = start
    if f.kind == "crash":
        # The ranks die together (one process, or every rank of a failed node) somewhere in
        # their compute of step k.
        onset_time = start + float(arrival[culprits].min()) * float(rng.uniform(0.05, 0.95))
        death[culprits] = onset_time
        arrival[culprits] = np.inf
        if f.teardown_s is not None:
            death = np.minimum(death, onset_time + f.teardown_s)
    elif f.variant in (None, "idle"):
        arrival[culprits] = np.inf  # never leaves compute / data loading
    elif f.variant == "stuck_collective":
        stuck_groups = {r // tp for r in culprits}
    else:
        raise ValueError(f"hang variant {f.variant!r}")
    tp_end = arrival.reshape(g_n, tp).max(axis=1) + t_tp
    for g in stuck_groups:
        tp_end[g] = np.inf
    dp_end = tp_end.max() + t_dp  # every dp group has a member in every tp group
    stall = _Stall(
        index=k,
        start=start,
        arrival=arrival,
        tp_end=np.repeat(tp_end, tp),
        dp_end=np.tile(dp_end, g_n),
        death=death,
    )
    cut = slice(0, k)
    faults = tuple(replace(x, onset_time=onset_time) if x is f else x for x in run.faults)
    return replace(
        run,
        faults=faults,
        steps=run.steps[cut],
        step_start=run.step_start[cut],
        step_end=run.step_end[cut],
        compute=run.compute[:, cut],
        data_time=run.data_time[:, cut],
        comm_time=run.comm_time[:, cut],
        step_time=run.step_time[:, cut],
        loss=run.loss[:, cut],
        grad_norm=run.grad_norm[:, cut],
        mem_bytes=run.mem_bytes[:, cut],
        tp_dur=run.tp_dur[:, :, cut],
        dp_dur=run.dp_dur[:, :, cut],
        tp_bytes=run.tp_bytes[:, cut],
        dp_bytes=run.dp_bytes[:, cut],
        arrival=run.arrival[:, cut],
        tp_end_rel=run.tp_end_rel[:, cut],
        dp_end_rel=run.dp_end_rel[:, cut],
        stall=stall,
    )


def rank_states(run: Run, now: float, *, drop_exited: bool = True) -> list[RankState]:
    """What the backend knows of every rank at wall-clock ``now`` (no shipping delay).

    A rank in the step in progress is computing (no in-flight op) until it arrives at its
    tp all-reduce, then blocked in ``tp-g``, ``dp-j`` and ``world`` in turn (seq = the step
    id). Heartbeats arrive every ``heartbeat_s`` at a per-rank phase while the process lives.
    After the last step of a run that did not stop, every process exits within 0.5 s and
    says goodbye (the collector's ``exiting`` heartbeat); with ``drop_exited`` those ranks
    are left out, as ``backend.detection.runner.sweep_job`` leaves them out.
    """
    cfg = run.config
    r_n, tp = cfg.ranks, cfg.tp
    n_done = int(np.searchsorted(run.step_end, now, side="right"))  # steps finished by now
    stall = run.stall
    if stall is not None:
        n_done = min(n_done, stall.index)
    in_progress: int | None
    if stall is not None and n_done == stall.index:
        in_progress = stall.index
        start = stall.start
        arrival, tp_end, dp_end = stall.arrival, stall.tp_end, stall.dp_end
        death = stall.death
    elif n_done < run.n_steps:
        in_progress = n_done
        start = float(run.step_start[n_done])
        arrival = run.arrival[:, n_done]
        tp_end = np.repeat(run.tp_end_rel[:, n_done], tp)
        dp_end = np.tile(run.dp_end_rel[:, n_done], cfg.n_tp_groups)
        death = np.full(r_n, np.inf)
    else:  # the run is over: every process exits shortly after the last step
        in_progress = None
        start = run.last_progress
        death = run.last_progress + run.exit_delay

    last_step = int(run.steps[n_done - 1]) if n_done else None
    last_step_ts = float(run.step_end[n_done - 1]) if n_done else None
    if n_done == 0 and stall is not None and stall.index == 0:
        last_step, last_step_ts = None, None
    step_id = cfg.first_step + (in_progress if in_progress is not None else n_done)

    # Last heartbeat at or before min(now, death): beats at t0 + phase + n * heartbeat_s.
    until = np.minimum(now, death)
    beats = np.floor((until - cfg.t0 - run.hb_phase) / cfg.heartbeat_s)
    last_hb = cfg.t0 + run.hb_phase + beats * cfg.heartbeat_s
    last_hb = np.where(beats >= 0, last_hb, cfg.t0)

    rel = now - start
    exited = in_progress is None and stall is None  # a clean end: goodbyes at death
    states: list[RankState] = []
    for r in range(r_n):
        if exited and drop_exited and now >= death[r]:
            continue
        inflight = None
        if in_progress is not None and now < death[r]:
            if rel >= dp_end[r]:
                inflight = Inflight("world", OP, step_id, start + float(dp_end[r]))
            elif rel >= tp_end[r]:
                inflight = Inflight(f"dp-{r % tp}", OP, step_id, start + float(tp_end[r]))
            elif rel >= arrival[r]:
                inflight = Inflight(f"tp-{r // tp}", OP, step_id, start + float(arrival[r]))
        states.append(
            RankState(
                rank=r,
                last_step=last_step,
                current_step=step_id if in_progress is not None else None,
                last_step_ts=last_step_ts,
                last_heartbeat_ts=float(last_hb[r]),
                inflight=inflight,
                host=f"node-{r // tp}",  # a node holds a tensor-parallel group, as in practice
            )
        )
    return states


def recent_step_durations(run: Run, n_done: int | None = None, *, limit: int = 400) -> FloatArray:
    """The step durations the backend hands the hang detector once ``n_done`` steps have
    finished (default: all): its last ``limit`` step records, any ranks
    (``backend.detection.window.recent_step_durations``). With R ranks reporting every step
    that is the last ``ceil(limit / R)`` steps."""
    end = run.n_steps if n_done is None else min(n_done, run.n_steps)
    n = max(1, math.ceil(limit / run.n_ranks))
    out: FloatArray = run.step_time[0, max(0, end - n) : end].copy()
    return out

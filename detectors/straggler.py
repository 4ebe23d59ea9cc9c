"""Straggler detection: the rank whose compute time pulls away from the other ranks'.

    >>> import numpy as np
    >>> from detectors.straggler import StragglerConfig, detect_stragglers
    >>> rng = np.random.default_rng(0)
    >>> steps = np.arange(100)
    >>> step_time = rng.normal(1.0, 0.01, size=(8, 100))
    >>> step_time[3, 40:] *= 1.6                     # rank 3 turns 60% slower at step 40
    >>> [f] = detect_stragglers(steps, step_time)
    >>> f.key, f.first_step, f.active, f.severity
    ('straggler:3', 40, True, 'critical')

Method (after NVRx, C4 and Falcon). In synchronous data-parallel training every rank has the
same step time, because each step ends in a collective that waits for the slowest rank; the
straggler is the rank that *waits least* in collectives. So the signal is the compute time
``step_time - comm_time`` (:func:`detectors.timing.compute_time`). Without ``comm_time``
(e.g. asynchronous or parameter-server jobs, whose per-worker mini-batch times already
differ) the step time is used as is. Where ``comm_time`` is given but a cell of it is NaN,
that rank's step is not compared: its compute time would be its whole step time, collective
wait included, and would look slow next to the ranks whose wait is known.

1. Per step, each rank's ratio to a reference compute time: the fast quartile of the ranks
   (the 25th percentile across ranks, NaN-tolerant; ``reference_quantile``). Not the
   median: when a group of ranks (a quarter to nearly half of the job) turns slower
   together, the median moves toward them and each sits just over the threshold; the fast
   quartile stays with the fast majority as long as fewer than three quarters are slow.
2. Per rank, its *normal* ratio: the median over the first ``baseline_steps`` steps of the
   window, capped at ``max_baseline_ratio`` (or ``baseline=`` from the caller, uncapped);
   floored at 1, since a rank that is normally fast is no straggler at the reference speed.
   The backend learns it once per run and attempt (:func:`learn_baselines`) and passes it
   back to every later window, so a slowdown that lasts thousands of steps is not absorbed
   once the window has slid past its onset.
   Dividing by it means a rank on slower hardware that is 10% slower from the start never
   fires: only a *change* in a rank's relative speed counts. The cap means a rank that is
   already far slower when the window opens still fires, from the window's first step.
3. Per step, a robust scale of the baseline-corrected ratios across the ranks that are not
   slow (1.4826 · MAD about the reference level 1 of the ratios up to ``1 +
   rel_threshold``, at least ``scale_floor``): a slow group does not widen the yardstick.
   A step is *over threshold* for a rank when its corrected ratio exceeds
   ``1 + max(rel_threshold, z_threshold · scale)``: at least 10% slower than its normal
   (tiny absolute differences never fire) and an outlier given the spread of the other
   ranks at that step (noisy jobs need a larger gap).
4. Persistence: a rank fires while at least ``persist_k`` of its last ``persist_m`` steps are
   over threshold (missing steps keep the rank's previous state). A run of firing steps is
   an episode; its onset is the first over-threshold step of the window that first met the
   persistence rule. An episode still firing at the window's last step is ``active``; one
   that ended inside the window is reported with ``active=False`` and ``last_step``.
5. Material, not blips: an episode is reported once it cost the job ``min_cost_s`` (0.5 s)
   — the rank's compute beyond its normal, summed over the episode, which is what the other
   ranks waited for it. A short one (under ``blip_steps`` steps) must also cost
   ``blip_share`` (10%) of its step time, and once over, have been ``blip_ratio`` (1.3x)
   slower. On a busy host the OS takes a rank's core for a moment: 14 ms more on a 5 ms
   compute inside 20 ms steps, for 8 steps, is that, not a straggler; a rank 0.15 s slower
   per step costs 0.5 s within 4 steps and is reported as soon as persistence allows.
6. A noisy host: when more than one rank has an episode in the window (on a busy 2-core
   machine the OS takes one rank's core, then another's, for a second or two at a time),
   and always with two ranks, an episode is reported once it lasted ``noisy_min_s`` (10 s)
   of step time or cost ``noisy_min_cost_s`` (3 s: what the other ranks waited for it), so
   contention is not a parade of stragglers while a real one, which lasts or costs, still
   shows. One straggler among quiet ranks is reported as soon as step 4 allows.

**Two ranks.** A cross-rank median of two is their mean and their spread is the gap itself,
so with two ranks (README's example) each rank is compared with *the other one*: its compute
time over the other's, corrected by its normal ratio as above, over threshold when at least
``rel_threshold`` above it and ``z_threshold`` robust standard deviations of that ratio's
own step-to-step noise over the first ``baseline_steps`` steps. In synchronous training the
slow rank is still the one that waits least, so it is named (evidence ``compared_with``:
``"the other rank"``). Without collective waits (``comm_time`` missing) synchronous ranks
show the same step time and nothing can be told apart; asynchronous ranks still can.

Everything up to the per-rank episode bookkeeping is vectorized over ranks and steps; only
ranks that fired are looked at one by one. 16,384 ranks x 200 steps take a few tens of ms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from detectors.finding import Finding, Severity
from detectors.registry import register
from detectors.robust import mad_scale_rows, nanmedian_rows, nanquantile_rows_counts
from detectors.timing import compute_time
from detectors.window import Window

FloatArray = npt.NDArray[np.float64]
F32Array = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

__all__ = ["StragglerConfig", "detect_stragglers", "learn_baselines"]


@dataclass(frozen=True)
class StragglerConfig:
    """Thresholds of :func:`detect_stragglers`. Ratios are rank time / median rank time.

    rel_threshold: a step counts as slow when the rank is at least this much slower than its
        own normal ratio (0.10 = 10%).
    z_threshold: ... and at least this many robust standard deviations (of the other ranks'
        corrected ratios at that step) above it.
    scale_floor: lower bound on that standard deviation, in ratio units, so identical ranks
        do not turn noise into huge z-scores.
    persist_k, persist_m: fire while at least ``persist_k`` of the last ``persist_m`` steps
        are slow.
    baseline_steps: the first steps of the window from which each rank's normal ratio is
        estimated (when the caller gives no ``baseline``).
    max_baseline_ratio: the largest slowdown that counts as a rank's normal (heterogeneous
        hardware); above it, the excess is a straggler from the window's start.
    reference_quantile: the quantile of the ranks' compute times each rank is compared with
        (0.25: the fast quartile; 0.5 would be the median, which a slow group drags along).
    min_ranks: steps with fewer reporting ranks are ignored (no meaningful median); a job
        of exactly two ranks is compared pairwise instead (see the module's "Two ranks").
    critical_ratio: slowdown (vs the median rank) from which a finding is ``critical``.
    min_cost_s: an episode is reported once it cost the job this many seconds: the rank's
        compute beyond its normal, summed over the episode (what the others waited for it).
    blip_ratio, blip_steps, blip_share: an episode shorter than ``blip_steps`` steps is
        noise (not reported) while its cost is under ``blip_share`` of its step time over
        the episode, and once it is over, when it was under ``blip_ratio`` times slower
        than normal.
    noisy_min_s, noisy_min_cost_s: when more than one rank has an episode in the window, or
        the job has two ranks, an episode is reported once it lasted ``noisy_min_s`` seconds
        (of step time) or cost ``noisy_min_cost_s`` seconds (its compute beyond its normal,
        summed: what the other ranks waited for it).
    """

    rel_threshold: float = 0.10
    z_threshold: float = 3.0
    scale_floor: float = 0.01
    persist_k: int = 5
    persist_m: int = 8
    baseline_steps: int = 20
    max_baseline_ratio: float = 1.15
    reference_quantile: float = 0.25
    min_ranks: int = 3
    critical_ratio: float = 1.5
    blip_ratio: float = 1.3
    blip_steps: int = 10
    blip_share: float = 0.10
    min_cost_s: float = 0.5
    noisy_min_s: float = 10.0
    noisy_min_cost_s: float = 3.0

    def __post_init__(self) -> None:
        if self.rel_threshold <= 0 or self.z_threshold < 0 or self.scale_floor <= 0:
            raise ValueError("rel_threshold and scale_floor must be > 0, z_threshold >= 0")
        if not 1 <= self.persist_k <= self.persist_m <= 255:
            raise ValueError("need 1 <= persist_k <= persist_m <= 255")
        if self.baseline_steps < 1 or self.min_ranks < 2:
            raise ValueError("need baseline_steps >= 1 and min_ranks >= 2")
        if self.max_baseline_ratio < 1 or self.critical_ratio <= 1:
            raise ValueError("need max_baseline_ratio >= 1 and critical_ratio > 1")
        if not 0.0 < self.reference_quantile <= 0.5:
            raise ValueError("need 0 < reference_quantile <= 0.5")


DEFAULT_CONFIG = StragglerConfig()
TIMES = "\u00d7"  # the multiplication sign of "1.74x slower" in summaries
_TRANSPOSE_BLOCK = 1024  # ranks per block when turning (ranks x steps) into (steps x ranks)
_SCALE_SAMPLE = 4096  # ranks that suffice to estimate the per-step spread across ranks
_SAMPLE_CHUNK = 64


def detect_stragglers(
    steps: npt.ArrayLike,
    step_time: npt.ArrayLike,
    comm_time: npt.ArrayLike | None = None,
    ranks: npt.ArrayLike | None = None,
    *,
    baseline: npt.ArrayLike | None = None,
    config: StragglerConfig = DEFAULT_CONFIG,
) -> list[Finding]:
    """Find ranks that turned slow relative to the others within one window of steps.

    steps: (S,) strictly increasing step numbers, the columns of the arrays below.
    step_time: (R, S) step duration per rank and step; NaN where a rank did not report.
    comm_time: (R, S) time spent in collectives, optional; compute = step_time - comm_time.
    ranks: (R,) rank ids of the rows; default ``0..R-1``.
    baseline: (R,) each rank's normal ratio to the reference, if the caller keeps one across
        windows (:func:`learn_baselines`; NaN entries are estimated from this window);
        default: estimated.

    Returns one ``Finding`` (kind ``straggler``, key ``straggler:<rank>``) per rank with an
    episode in the window, the most recent episode, highest score first.
    """
    cfg = config
    step_ids, times, comm, rank_ids, base_in = _validate(
        steps, step_time, comm_time, ranks, baseline
    )
    n_ranks, n_steps = times.shape
    pairwise = n_ranks == 2
    if (n_ranks < cfg.min_ranks and not pairwise) or n_steps == 0:
        return []

    ratio, reference = _ratio_to_reference(times, comm, pairwise, cfg)
    median_compute: FloatArray | None = reference if pairwise else None  # evidence, lazily

    # 2. Each rank's normal ratio, and the ratio corrected by it.
    base = _baselines(ratio, base_in, cfg)
    adj = ratio  # alias: corrected in place to keep one (S x R) buffer
    adj /= base.astype(np.float32)[None, :]

    # 3. Per-step robust scale of the corrected ratios; slow steps.
    scale = _pair_scale(adj, cfg) if pairwise else _majority_scale(adj, cfg)
    margin = np.maximum(cfg.rel_threshold, cfg.z_threshold * scale)
    valid = np.isfinite(adj)
    over = adj >= (1.0 + margin).astype(np.float32)[:, None]  # NaN compares False

    # 4. Persistence: k of the last m steps; a missing step carries the previous state.
    held = _carry_forward(over, valid)
    count = np.zeros((n_steps, n_ranks), dtype=np.uint8)
    for lag in range(min(cfg.persist_m, n_steps)):
        count[lag:] += held[: n_steps - lag]
    firing = count >= cfg.persist_k

    def episodes(cols: IntArray, step_s: FloatArray | None, min_span_s: float) -> list[Finding]:
        nonlocal median_compute
        if not cols.size:
            return []
        if median_compute is None:  # the evidence's median, computed only when a rank fires
            median_compute = nanmedian_rows(_compute_by_step(times, comm), overwrite=True)
        median = median_compute
        out = []
        for col in cols.tolist():
            finding = _episode_finding(
                col=col,
                rank=int(rank_ids[col]),
                step_ids=step_ids,
                firing=firing[:, col],
                held=held[:, col],
                over=over[:, col],
                valid=valid[:, col],
                adj=adj[:, col],
                base=float(base[col]),
                scale=scale,
                margin=margin,
                median_compute=median[:, col] if pairwise else median,
                reference=reference[:, col] if pairwise else reference,
                pairwise=pairwise,
                times=times,
                comm=comm,
                cfg=cfg,
                step_s=step_s,
                min_span_s=min_span_s,
            )
            if finding is not None:
                out.append(finding)
        return out

    findings = episodes(np.flatnonzero(firing.any(axis=0)), None, 0.0)
    if len(findings) > 1 or (pairwise and findings):
        # 6. More than one rank had an episode in this window (a noisy host, or several slow
        # ranks), or there are only two ranks, whose ratio carries both ranks' noise: only
        # episodes that lasted ``noisy_min_s`` seconds of step time count.
        cols = np.flatnonzero(np.isin(rank_ids, [f.ranks[0] for f in findings]))
        step_s = nanmedian_rows(np.ascontiguousarray(times[cols].T))
        findings = episodes(cols, step_s, cfg.noisy_min_s)
    findings.sort(key=lambda f: (-f.score, f.ranks))
    return findings


def learn_baselines(
    steps: npt.ArrayLike,
    step_time: npt.ArrayLike,
    comm_time: npt.ArrayLike | None = None,
    *,
    config: StragglerConfig = DEFAULT_CONFIG,
) -> FloatArray:
    """Each rank's normal ratio to the reference, learned from the window's first
    ``baseline_steps`` steps (capped at ``max_baseline_ratio``, floored at 1), for a caller
    that keeps it across windows and passes it back as ``baseline=``: once the window has
    slid past the onset of a slowdown that lasts, its own first steps would be slow ones and
    absorb it. NaN for a rank with fewer than half of those steps reported, and for every
    rank while the window has fewer than ``baseline_steps`` steps (too early to tell).
    """
    cfg = config
    _, times, comm, _, _ = _validate(steps, step_time, comm_time, None, None)
    n_ranks, n_steps = times.shape
    pairwise = n_ranks == 2
    out = np.full(n_ranks, np.nan)
    if (n_ranks < cfg.min_ranks and not pairwise) or n_steps < cfg.baseline_steps:
        return out
    ratio, _ = _ratio_to_reference(times[:, : cfg.baseline_steps], _head(comm, cfg), pairwise, cfg)
    enough = np.isfinite(ratio).sum(axis=0) * 2 >= cfg.baseline_steps
    base = _baselines(ratio, None, cfg)
    out[enough] = base[enough]
    return out


def _head(comm: FloatArray | None, cfg: StragglerConfig) -> FloatArray | None:
    return None if comm is None else comm[:, : cfg.baseline_steps]


def _ratio_to_reference(
    times: FloatArray, comm: FloatArray | None, pairwise: bool, cfg: StragglerConfig
) -> tuple[F32Array, FloatArray]:
    """Step 1: (steps x ranks) compute time over the reference — the fast quartile of the
    ranks at that step, or the other rank of two — and the (S,) or (S, 2) reference."""
    # Work in (steps x ranks) layout: every per-step reduction runs along contiguous memory.
    ratio = _compute_by_step(times, comm)
    nonpositive = ratio <= 0
    if nonpositive.any():
        ratio[nonpositive] = np.nan  # no compute left (or bad data): treat as missing
    reference: FloatArray
    if pairwise:
        other = np.ascontiguousarray(ratio[:, ::-1])
        reference = other.astype(np.float64)  # (S, 2): each rank's reference
        ratio /= other
    else:
        reference, reporting = nanquantile_rows_counts(ratio, cfg.reference_quantile)
        reference[(reporting < cfg.min_ranks) | ~(reference > 0)] = np.nan
        ratio /= reference.astype(np.float32)[:, None]  # in place: compute / reference
    return ratio, reference


def _validate(
    steps: npt.ArrayLike,
    step_time: npt.ArrayLike,
    comm_time: npt.ArrayLike | None,
    ranks: npt.ArrayLike | None,
    baseline: npt.ArrayLike | None,
) -> tuple[IntArray, FloatArray, FloatArray | None, IntArray, FloatArray | None]:
    step_ids = np.asarray(steps, dtype=np.int64)
    times = np.asarray(step_time, dtype=np.float64)
    if step_ids.ndim != 1:
        raise ValueError(f"steps must be 1-D, got shape {step_ids.shape}")
    if times.ndim != 2 or times.shape[1] != step_ids.size:
        raise ValueError(f"step_time must be (ranks, {step_ids.size}), got {times.shape}")
    if step_ids.size > 1 and not np.all(np.diff(step_ids) > 0):
        raise ValueError("steps must be strictly increasing")
    comm = None
    if comm_time is not None:
        comm = np.asarray(comm_time, dtype=np.float64)
        if comm.shape != times.shape:
            raise ValueError(f"comm_time must have step_time's shape {times.shape}")
    n_ranks = times.shape[0]
    rank_ids = np.arange(n_ranks) if ranks is None else np.asarray(ranks, dtype=np.int64)
    if rank_ids.shape != (n_ranks,):
        raise ValueError(f"ranks must have one id per row of step_time ({n_ranks})")
    base = None
    if baseline is not None:
        base = np.asarray(baseline, dtype=np.float64)
        if base.shape != (n_ranks,):
            raise ValueError(f"baseline must have one value per rank ({n_ranks})")
    return step_ids, times, comm, rank_ids, base


def _compute_by_step(times: FloatArray, comm: FloatArray | None) -> F32Array:
    """``(times - comm).T`` as a C-contiguous (steps x ranks) float32 array.

    float32 is plenty for ratios near 1 and halves the memory traffic of every later pass.
    Copied in blocks of ranks: a plain transposing copy of a large array walks memory with
    a long stride and is several times slower.
    """
    n_ranks, n_steps = times.shape
    out = np.empty((n_steps, n_ranks), dtype=np.float32)
    for lo in range(0, n_ranks, _TRANSPOSE_BLOCK):
        hi = lo + _TRANSPOSE_BLOCK
        if comm is None:
            out[:, lo:hi] = times[lo:hi].T
        else:
            wait = comm[lo:hi].T
            out[:, lo:hi] = compute_time(times[lo:hi].T, wait)
            out[:, lo:hi][np.isnan(wait)] = np.nan  # wait unknown: not compared
    return out


def _rank_sample(by_step: F32Array) -> F32Array:
    """Columns (ranks) enough for a per-step spread estimate: all of them up to
    ``2 * _SCALE_SAMPLE``, else ``_SAMPLE_CHUNK`` consecutive ranks out of every period, so
    each node-local rank position and each part of the job is represented."""
    n_steps, n_ranks = by_step.shape
    if n_ranks <= 2 * _SCALE_SAMPLE:
        return by_step
    period = _SAMPLE_CHUNK * -(-n_ranks // _SCALE_SAMPLE)
    n_periods = n_ranks // period
    blocks = by_step[:, : n_periods * period].reshape(n_steps, n_periods, period)
    sample: F32Array = np.ascontiguousarray(blocks[:, :, :_SAMPLE_CHUNK]).reshape(n_steps, -1)
    return sample


def _baselines(ratio: F32Array, given: FloatArray | None, cfg: StragglerConfig) -> FloatArray:
    """Each rank's normal ratio to the reference, in [1, max_baseline_ratio]."""
    n_ranks = ratio.shape[1]
    base = np.full(n_ranks, np.nan) if given is None else given.copy()
    todo = ~np.isfinite(base)
    if todo.any():
        early = ratio[: cfg.baseline_steps]
        early = early if todo.all() else early[:, todo]
        estimate = nanmedian_rows(np.ascontiguousarray(early.T), overwrite=True)
        base[todo] = np.minimum(estimate, cfg.max_baseline_ratio)
    base[~np.isfinite(base)] = 1.0  # no data early in the window: assume a normal rank
    clipped: FloatArray = np.maximum(base, 1.0)
    return clipped


def _majority_scale(adj: F32Array, cfg: StragglerConfig) -> FloatArray:
    """Per step, the spread of the ranks that are not slow: 1.4826 · MAD about 1 of the
    corrected ratios up to ``1 + rel_threshold``. Ranks beyond that (a slow group, however
    large) do not widen the yardstick they are measured with; the noise of the others does."""
    sample = _rank_sample(adj)
    fast = np.where(sample <= np.float32(1.0 + cfg.rel_threshold), sample, np.float32(np.nan))
    return mad_scale_rows(fast, center=np.ones(adj.shape[0]), floor=cfg.scale_floor)


def _pair_scale(adj: F32Array, cfg: StragglerConfig) -> FloatArray:
    """Two ranks: the robust step-to-step spread of rank 1's ratio to rank 0 (rank 0's is its
    inverse) over the first ``baseline_steps`` steps, in ratio units, for every step."""
    n_steps = adj.shape[0]
    early = adj[: cfg.baseline_steps, 1].astype(np.float64)
    early = np.log(early[np.isfinite(early) & (early > 0)])
    spread = 0.0
    if early.size:
        spread = 1.4826 * float(np.median(np.abs(early - np.median(early))))
    return np.full(n_steps, max(spread, cfg.scale_floor))


def _carry_forward(over: BoolArray, valid: BoolArray) -> BoolArray:
    """``over`` with each missing step holding the rank's previous state (False before any)."""
    if valid.all():
        return over
    held = over.copy()
    gaps = ~valid
    for s in np.flatnonzero(gaps[1:].any(axis=1)) + 1:
        np.copyto(held[s], held[s - 1], where=gaps[s])
    return held


def _runs(mask: BoolArray) -> list[tuple[int, int]]:
    """Inclusive (start, end) index pairs of the True runs of a 1-D mask."""
    padded = np.concatenate(([False], mask, [False]))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return [(int(a), int(b) - 1) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _episode_finding(
    *,
    col: int,
    rank: int,
    step_ids: IntArray,
    firing: BoolArray,
    held: BoolArray,
    over: BoolArray,
    valid: BoolArray,
    adj: F32Array,
    base: float,
    scale: FloatArray,
    margin: FloatArray,
    median_compute: FloatArray,
    reference: FloatArray,
    pairwise: bool,
    times: FloatArray,
    comm: FloatArray | None,
    cfg: StragglerConfig,
    step_s: FloatArray | None = None,
    min_span_s: float = 0.0,
) -> Finding | None:
    """The finding for one rank that fired: its most recent episode, or None when every
    episode rests on fewer than ``persist_k`` observed slow steps (e.g. one slow step and
    then no more reports: carrying that state forward is not evidence)."""
    episodes: list[tuple[int, int, int, int]] = []  # (onset, last, detected, end) indices
    for start, end in _runs(firing):
        window = max(0, start - cfg.persist_m + 1)
        # Onset and end are observed slow steps where there are some (else carried ones).
        slow = over if over[window : end + 1].any() else held
        onset = window + int(np.argmax(slow[window : start + 1]))
        last = onset + int(np.flatnonzero(slow[onset : end + 1])[-1])
        if int(over[onset : last + 1].sum()) < cfg.persist_k:
            continue
        ended = end < firing.size - 1
        cost, own_span = _cost(col, onset, last, times, comm, reference, base)
        if cost < cfg.min_cost_s:
            continue  # immaterial (so far): the job lost next to nothing to it
        if last - onset + 1 < cfg.blip_steps:
            seen_ = valid[onset : last + 1]
            peak = _median(adj[onset : last + 1][seen_].astype(np.float64))
            if (peak < cfg.blip_ratio and ended) or cost < cfg.blip_share * own_span:
                continue  # a short blip, mild and over or cheap: noise (so far)
        if (
            step_s is not None
            and float(np.nansum(step_s[onset : last + 1])) < min_span_s
            and cost < cfg.noisy_min_cost_s
        ):
            continue  # a noisy host: neither sustained nor costly (yet)
        episodes.append((onset, last, start, end))
    if not episodes:
        return None
    onset, last, detected, end = episodes[-1]
    active = end == firing.size - 1

    span = slice(onset, last + 1)
    seen = valid[span]
    rank_compute = compute_time(times[col, span], None if comm is None else comm[col, span])
    corrected = adj[span][seen].astype(np.float64)
    raw = corrected * base
    z = (corrected - 1.0) / scale[span][seen]
    ratio = _median(raw)
    score = _median(z)
    first_step = int(step_ids[onset])
    last_step = int(step_ids[last])

    evidence: dict[str, Any] = {
        "basis": "step_time" if comm is None else "compute",
        "median_compute_s": _sig(_median(median_compute[span][seen])),
        "reference_compute_s": _sig(_median(reference[span][seen])),
        "rank_compute_s": _sig(_median(rank_compute[seen])),
        "ratio": _sig(ratio),
        "baseline_ratio": _sig(base),
        "ratio_vs_baseline": _sig(_median(corrected)),
        "threshold_ratio": _sig(base * (1.0 + _median(margin[span]))),
        "steps_over_threshold": int(over[span].sum()),
        "steps_observed": int(seen.sum()),
        "detected_step": int(step_ids[detected]),
        "last_slow_step": last_step,
        "persistence": f"{cfg.persist_k} of {cfg.persist_m} steps",
    }
    if pairwise:
        evidence["compared_with"] = "the other rank"
    if len(episodes) > 1:
        evidence["earlier_episodes"] = [
            [int(step_ids[a]), int(step_ids[b])] for a, b, _, _ in episodes[:-1]
        ]

    than = "the other rank" if pairwise else "the fast ranks"
    slower = f"{ratio:.2f}{TIMES} slower than {than}"
    if comm is None:
        slower += " (step time)"
    usual = f"; its normal is {base:.2f}{TIMES}" if base >= 1.02 else ""
    if active:
        verb = "computes" if comm is not None else "is"
        summary = f"rank {rank} {verb} {slower} since step {first_step}{usual}"
    else:
        verb = "computed" if comm is not None else "was"
        when = f"from step {first_step} to {last_step}, then recovered"
        summary = f"rank {rank} {verb} {slower} {when}{usual}"
    severity: Severity = "critical" if ratio >= cfg.critical_ratio else "warning"
    return Finding(
        kind="straggler",
        severity=severity,
        ranks=(rank,),
        first_step=first_step,
        score=_sig(score),
        summary=summary,
        key=f"straggler:{rank}",
        evidence=evidence,
        active=active,
        last_step=None if active else last_step,
    )


def _cost(
    col: int,
    onset: int,
    last: int,
    times: FloatArray,
    comm: FloatArray | None,
    reference: FloatArray,
    base: float,
) -> tuple[float, float]:
    """Seconds one episode cost: the rank's compute beyond its normal (its (S,) reference ×
    its baseline ratio), summed over the episode; and the rank's own step time over it."""
    span = slice(onset, last + 1)
    own = compute_time(times[col, span], None if comm is None else comm[col, span])
    excess = np.clip(own - reference[span] * base, 0.0, None)
    return float(np.nansum(excess)), float(np.nansum(times[col, span]))


def _median(values: FloatArray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if finite.size else float("nan")


def _sig(value: float) -> float:
    """Four significant digits: readable evidence whatever the unit."""
    return float(f"{value:.4g}")


@register("straggler", kinds={"straggler"}, needs={"steps"})
def _detect_window(window: Window) -> list[Finding]:
    w = window.steps
    assert w is not None
    return detect_stragglers(
        w.steps,
        w.step_time,
        comm_time=w.comm_time if w.has_comm else None,
        ranks=w.ranks,
        baseline=w.straggler_baseline,
    )

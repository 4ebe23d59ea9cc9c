"""Steps 1–3 of the straggler method (:mod:`detectors.straggler` states them): each rank's
compute time over the reference, its normal ratio, and the per-step spread of the corrected
ratios, vectorized over ranks and steps in a (steps x ranks) float32 layout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from detectors.robust import mad_scale_rows, nanmedian_rows, nanquantile_rows_counts
from detectors.timing import compute_time

if TYPE_CHECKING:
    from detectors.straggler import StragglerConfig

FloatArray = npt.NDArray[np.float64]
F32Array = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]

__all__ = [
    "baselines",
    "compute_by_step",
    "head",
    "majority_level",
    "majority_scale",
    "pair_scale",
    "per_rank",
    "ratio_to_reference",
    "validate",
]

_TRANSPOSE_BLOCK = 1024  # ranks per block when turning (ranks x steps) into (steps x ranks)
_SCALE_SAMPLE = 4096  # ranks that suffice to estimate the per-step spread across ranks
_SAMPLE_CHUNK = 64


def head(comm: FloatArray | None, cfg: StragglerConfig) -> FloatArray | None:
    return None if comm is None else comm[:, : cfg.baseline_steps]


def ratio_to_reference(
    times: FloatArray, comm: FloatArray | None, pairwise: bool, cfg: StragglerConfig
) -> tuple[F32Array, FloatArray]:
    """Step 1: (steps x ranks) compute time over the reference — the fast quartile of the
    ranks at that step, or the other rank of two — and the (S,) or (S, 2) reference."""
    # Work in (steps x ranks) layout: every per-step reduction runs along contiguous memory.
    ratio = compute_by_step(times, comm)
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


def validate(
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


def per_rank(values: npt.ArrayLike | None, name: str, n_ranks: int) -> FloatArray:
    """``values`` as an (R,) float array, all NaN when None."""
    if values is None:
        return np.full(n_ranks, np.nan)
    out = np.asarray(values, dtype=np.float64)
    if out.shape != (n_ranks,):
        raise ValueError(f"{name} must have one value per rank ({n_ranks})")
    return out


def compute_by_step(times: FloatArray, comm: FloatArray | None) -> F32Array:
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


def baselines(ratio: F32Array, given: FloatArray | None, cfg: StragglerConfig) -> FloatArray:
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


def majority_level(adj: F32Array, base: FloatArray, cfg: StragglerConfig) -> FloatArray:
    """Per step, the factor that moves the reference to the ``reference_quantile`` of the
    ranks that are not slow (corrected ratio under ``1 + hold_share · rel_threshold``):
    their quantile of the ratios over that of all ranks, 1 where no rank is slow.

    With a third of the ranks slow, the fast quartile of all ranks is the fast ranks' 37th
    percentile, about a third of their spread higher: a 1.10x group would look 1.09x and
    sit under a 10% threshold. Estimated on the ranks :func:`_rank_sample` keeps."""
    sample = _rank_sample(adj)
    ratio = sample * _rank_sample(base.astype(np.float32)[None, :])
    level = np.float32(1.0 + cfg.hold_share * cfg.rel_threshold)
    q = cfg.reference_quantile
    every, _ = nanquantile_rows_counts(ratio, q)
    fast, count = nanquantile_rows_counts(np.where(sample < level, ratio, np.float32(np.nan)), q)
    factor = fast / every
    factor[(count < cfg.min_ranks) | ~(factor > 0)] = 1.0
    return factor


def majority_scale(adj: F32Array, cfg: StragglerConfig) -> FloatArray:
    """Per step, the spread of the ranks that are not slow: 1.4826 · MAD about 1 of the
    corrected ratios up to ``1 + rel_threshold``. Ranks beyond that (a slow group, however
    large) do not widen the yardstick they are measured with; the noise of the others does."""
    sample = _rank_sample(adj)
    level = np.float32(1.0 + cfg.hold_share * cfg.rel_threshold)
    fast = np.where(sample < level, sample, np.float32(np.nan))
    return mad_scale_rows(fast, center=np.ones(adj.shape[0]), floor=cfg.scale_floor)


def pair_scale(adj: F32Array, cfg: StragglerConfig) -> FloatArray:
    """Two ranks: the robust step-to-step spread of rank 1's ratio to rank 0 (rank 0's is its
    inverse) over the first ``baseline_steps`` steps, in ratio units, for every step."""
    n_steps = adj.shape[0]
    early = adj[: cfg.baseline_steps, 1].astype(np.float64)
    early = np.log(early[np.isfinite(early) & (early > 0)])
    spread = 0.0
    if early.size:
        spread = 1.4826 * float(np.median(np.abs(early - np.median(early))))
    return np.full(n_steps, max(spread, cfg.scale_floor))

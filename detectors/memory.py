"""Memory pressure: peak memory that is already near capacity, or growing toward it.

    findings = detect_memory(peak_bytes, capacity_bytes, steps=steps)

``peak_bytes`` is ``(R, S)``: each rank's peak device memory at each step of the window (NaN
where not reported); ``capacity_bytes`` a scalar or ``(R,)`` (a rank with capacity ≤ 0 or
NaN is skipped).

Method, on the last ``window`` steps (columns), in two stages so that 16,384 healthy ranks
cost two BLAS matrix-vector products (about 2 ms; about 20 ms when every rank is leaking):

1. **Screen, all ranks.** A least-squares slope per rank (``y @ (t - mean t)``, NaN-aware)
   and the fitted level at the last step. A rank is a candidate when that line reaches
   capacity within twice the horizon, or its fitted or last value is within 10% of the
   ``usage_frac`` threshold. Ranks far from capacity and not growing stop here.
2. **Confirm, candidates only.** The growth rate is a Theil-Sen-style slope: the median of
   the ``h = window // 2`` disjoint pair slopes ``(y[i + h] - y[i]) / (t[i + h] - t[i])``,
   robust to spikes and to stair-step growth (allocator blocks) at O(window) per rank instead
   of the O(window**2) of all pairs. Growth counts only when at least ``min_rising_frac`` of
   those pairs rise (a sign test: 20 of 25 is p = 0.002 for flat noise) *and* the
   least-squares slope is ``min_trend_t`` standard errors above zero (a straight leak has
   zero residual and always counts). Current usage is the median of the last
   ``current_steps`` values, each carried along the slope to the last step (one odd step is
   ignored).
3. **Fire** when the growth reaches capacity within ``horizon_steps`` training steps, or the
   current usage is at least ``usage_frac`` of capacity. Severity is critical when capacity
   is reached within ``critical_steps`` (or already), warning otherwise.

All firing ranks share one finding (kind ``memory_pressure``, key ``"memory_pressure"``): a
leak usually hits every rank alike, and one incident for 16,384 ranks is what a person wants.
The evidence describes the worst rank (the soonest to fill) and counts the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from detectors.finding import Finding
from detectors.registry import register
from detectors.window import Window

__all__ = ["MemoryConfig", "detect_memory"]

_GIB = float(1 << 30)
_MIB = float(1 << 20)
_MAD_TO_SIGMA = 1.4826
_MEDIAN_SE = math.sqrt(math.pi / 2)  # standard error of a median, per sigma/sqrt(n)


@dataclass(frozen=True)
class MemoryConfig:
    """Tuning for :func:`detect_memory`."""

    window: int = 50
    """Most recent steps (columns) used for the trend."""
    min_points: int = 10
    """Fewer valid values than this in the window: no trend for that rank."""
    current_steps: int = 5
    """Current usage is the median of this many most recent values."""
    horizon_steps: int = 500
    """Fire when the trend reaches capacity within this many training steps."""
    critical_steps: int = 50
    """Critical when it does so within this many."""
    usage_frac: float = 0.95
    """Fire when current usage is at least this fraction of capacity."""
    min_trend_t: float = 5.0
    """The least-squares slope must be this many standard errors above zero."""
    min_rising_frac: float = 0.8
    """At least this fraction of the disjoint pairs must rise."""


def detect_memory(
    peak_bytes: npt.ArrayLike,
    capacity_bytes: npt.ArrayLike,
    *,
    steps: npt.ArrayLike | None = None,
    config: MemoryConfig | None = None,
) -> list[Finding]:
    """Find ranks whose memory is nearly full or on course to fill within the horizon.

    peak_bytes: ``(R, S)`` float bytes (``(S,)`` is one rank); NaN where not reported.
    capacity_bytes: scalar or ``(R,)`` bytes of device memory per rank.
    steps: ``(S,)`` int, the training step of each column; default ``0..S-1``.

    >>> used = np.linspace(60, 70, 100)[None, :] * 2**30  # 60 → 70 GiB over 100 steps
    >>> [f.severity for f in detect_memory(used, 80 * 2**30)]
    ['warning']
    """
    cfg = config or MemoryConfig()
    peak = np.asarray(peak_bytes)  # only the window is converted to float64 below
    if peak.ndim == 1:
        peak = peak[np.newaxis, :]
    if peak.ndim != 2:
        raise ValueError(f"expected a (ranks, steps) array, got shape {peak.shape}")
    n_ranks, n_steps = peak.shape
    cap = np.broadcast_to(np.asarray(capacity_bytes, dtype=np.float64), (n_ranks,))
    step_ids = (
        np.arange(n_steps, dtype=np.int64)
        if steps is None
        else np.asarray(steps, dtype=np.int64).reshape(-1)
    )
    if step_ids.size != n_steps:
        raise ValueError(f"steps has {step_ids.size} entries for {n_steps} columns")
    if n_ranks == 0 or n_steps == 0:
        return []

    w = min(cfg.window, n_steps)
    y = peak[:, n_steps - w :].astype(np.float64, copy=False)
    t = step_ids[n_steps - w :].astype(np.float64)
    usable = np.isfinite(cap) & (cap > 0)
    cand = np.flatnonzero(usable & _screen(y, t, cap, cfg))
    if cand.size == 0:
        return []

    yc, capc = (y, cap) if cand.size == n_ranks else (y[cand], cap[cand])
    slope, rising, t_stat = _confirm_trend(yc, t, cfg.min_points)
    # Current usage: the last few values, each carried forward along the slope to the last step.
    k = max(1, cfg.current_steps)
    carry = np.where(np.isfinite(slope), slope, 0.0)[:, None] * (t[-1] - t[-k:])
    current = _nanmedian_rows(yc[:, -k:] + carry)
    with np.errstate(divide="ignore", invalid="ignore"):
        growing = (slope > 0) & (rising >= cfg.min_rising_frac) & (t_stat >= cfg.min_trend_t)
        to_full = np.where(growing, np.maximum(capc - current, 0.0) / slope, np.inf)
        usage = current / capc
    trend_fire = to_full <= cfg.horizon_steps
    full_fire = usage >= cfg.usage_frac  # NaN (no recent value) compares False
    if not (trend_fire.any() or full_fire.any()):
        return []
    fit = _Fit(
        ranks=cand, current=current, slope=slope, capacity=capc, to_full=to_full, usage=usage
    )
    return [_finding(fit, trend_fire, full_fire, yc, step_ids, cfg)]


@dataclass(frozen=True)
class _Fit:
    """Per-candidate ``(C,)`` results: rank, bytes, bytes/step, bytes, steps (inf: never), frac."""

    ranks: NDArray[np.intp]
    current: NDArray[np.float64]
    slope: NDArray[np.float64]
    capacity: NDArray[np.float64]
    to_full: NDArray[np.float64]
    usage: NDArray[np.float64]


def _screen(
    y: NDArray[np.float64], t: NDArray[np.float64], cap: NDArray[np.float64], cfg: MemoryConfig
) -> NDArray[np.bool_]:
    """``(R,)`` bool: ranks worth a robust look (least-squares line near or heading to full)."""
    n_ranks, w = y.shape
    tc = t - t.mean()
    sum_y, sum_ty = y @ np.ones(w), y @ tc  # BLAS; a NaN anywhere in a row poisons both
    n = np.full(n_ranks, float(w))
    sum_t, sum_tt = np.zeros(n_ranks), np.full(n_ranks, float(tc @ tc))
    bad = ~(np.isfinite(sum_y) & np.isfinite(sum_ty))
    if bad.any():  # recompute those rows with missing values left out
        rows = np.flatnonzero(bad)
        finite = np.isfinite(y[rows])
        weight, y0 = finite.astype(np.float64), np.where(finite, y[rows], 0.0)
        n[rows], sum_t[rows], sum_tt[rows] = weight.sum(axis=1), weight @ tc, weight @ (tc * tc)
        sum_y[rows], sum_ty[rows] = y0.sum(axis=1), y0 @ tc
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_t, mean_y = sum_t / n, sum_y / n
        slope = (sum_ty - n * mean_t * mean_y) / (sum_tt - n * mean_t**2)
        level = mean_y + slope * (tc[-1] - mean_t)  # the line at the last step
        near = np.fmax(level, y[:, -1]) >= 0.9 * cfg.usage_frac * cap
        heading = (slope > 0) & (cap - level <= 2 * cfg.horizon_steps * slope)
    return np.asarray(near | (heading & (n >= cfg.min_points)))


def _confirm_trend(
    y: NDArray[np.float64], t: NDArray[np.float64], min_points: int
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Per row: robust slope (bytes/step), fraction of rising pairs, least-squares t-stat."""
    n_rows, w = y.shape
    h = w // 2
    if h == 0:
        nan = np.full(n_rows, np.nan)
        return nan, nan, nan
    ok = np.isfinite(y)
    complete = bool(ok.all())
    pairs = (y[:, h : 2 * h] - y[:, :h]) / (t[h : 2 * h] - t[:h])  # (C, h); NaN if a gap
    n_pairs = np.full(n_rows, h) if complete else np.isfinite(pairs).sum(axis=1)
    slope = _nanmedian_rows(pairs)
    rising = (pairs > 0).sum(axis=1) / np.maximum(n_pairs, 1)

    # Least-squares slope and its t-statistic: ls = sum(dt * dy) / sum(dt**2) with dt, dy
    # centred on each row's valid points (missing values get weight 0).
    if complete:
        n = np.full(n_rows, w)
        tc = t - t.mean()
        stt = np.full(n_rows, float(tc @ tc))
        dy = y - y.mean(axis=1, keepdims=True)
        sty = dy @ tc
    else:
        n = ok.sum(axis=1)
        weight = ok.astype(np.float64)
        y0 = np.where(ok, y, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            dt = (t - (weight @ t / n)[:, None]) * weight
            dy = (y0 - (y0.sum(axis=1) / n)[:, None]) * weight
        stt, sty = np.einsum("ij,ij->i", dt, dt), np.einsum("ij,ij->i", dt, dy)
    with np.errstate(divide="ignore", invalid="ignore"):
        ls = sty / stt
        ssr = np.maximum(np.einsum("ij,ij->i", dy, dy) - ls * sty, 0.0)  # residual sum of squares
        s_res = np.sqrt(ssr / np.maximum(n - 2, 1))
        t_stat = np.where(s_res > 0, ls * np.sqrt(stt) / s_res, np.where(ls > 0, np.inf, 0.0))
    if complete and w >= min_points:
        return slope, rising, t_stat
    too_few = (n < min_points) | (n_pairs < 2)
    return (
        np.where(too_few, np.nan, slope),
        np.where(too_few, np.nan, rising),
        np.where(too_few, np.nan, t_stat),
    )


def _nanmedian_rows(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """Per row, the median of the finite values; NaN for a row with none."""
    finite = np.isfinite(x)
    if finite.all():  # rows are short: a plain sort beats np.median's partition here
        k = x.shape[1]
        srt = np.sort(x, axis=1)
        return np.asarray((srt[:, (k - 1) // 2] + srt[:, k // 2]) / 2, dtype=np.float64)
    x = np.where(finite, x, np.nan)
    empty = ~finite.any(axis=1)
    x[empty] = 0.0  # keeps nanmedian quiet; those rows are set back to NaN below
    med = np.asarray(np.nanmedian(x, axis=1), dtype=np.float64)
    med[empty] = np.nan
    return med


def _finding(
    fit: _Fit,
    trend_fire: NDArray[np.bool_],
    full_fire: NDArray[np.bool_],
    y: NDArray[np.float64],
    step_ids: NDArray[np.int64],
    cfg: MemoryConfig,
) -> Finding:
    """One finding for every firing candidate; ``y`` holds the candidates' windows."""
    fire = np.flatnonzero(trend_fire | full_fire)  # indexes into the candidates
    usage, to_full, slope = fit.usage, fit.to_full, fit.slope
    ranks = fit.ranks[fire]
    # The worst rank: the soonest to fill, or the fullest if none is filling.
    filling = np.flatnonzero(trend_fire)
    i = int(
        filling[np.argmin(to_full[filling])]
        if filling.size
        else np.flatnonzero(full_fire)[np.argmax(usage[full_fire])]
    )
    worst = int(fit.ranks[i])
    last_step = int(step_ids[-1])
    steps_left = float(to_full[i])
    w_cap, w_cur, w_use = float(fit.capacity[i]), float(fit.current[i]), float(usage[i])
    w_slope = float(slope[i]) if np.isfinite(slope[i]) else 0.0
    critical = steps_left <= cfg.critical_steps or w_cur >= w_cap
    window_start = int(step_ids[-y.shape[1]])

    evidence: dict[str, Any] = {
        "worst_rank": worst,
        "current_gib": round(w_cur / _GIB, 2),
        "capacity_gib": round(w_cap / _GIB, 2),
        "usage_pct": round(100 * w_use, 1),
        "slope_mib_per_step": _round(w_slope / _MIB),
        "ranks_near_full": int(full_fire.sum()),
        "ranks_filling": int(trend_fire.sum()),
        "window_steps": y.shape[1],
    }
    if math.isfinite(steps_left):
        evidence["steps_to_capacity"] = math.ceil(steps_left)
        evidence["projected_full_step"] = last_step + math.ceil(steps_left)

    where = f"rank {worst}" + (f" (and {ranks.size - 1} more)" if ranks.size > 1 else "")
    summary = (
        f"{where} peak memory {w_cur / _GIB:.1f} of {w_cap / _GIB:.1f} GiB ({100 * w_use:.0f}%)"
    )
    if math.isfinite(steps_left):
        summary += (
            f", growing {w_slope / _MIB:.3g} MiB/step: full in ~{math.ceil(steps_left)} steps "
            f"(step {evidence['projected_full_step']})"
        )
    # Onset: when the worst rank first crossed the usage threshold in the window, else the
    # start of the window the trend was fitted on.
    above = np.flatnonzero(y[i] >= cfg.usage_frac * w_cap)
    first_step = int(step_ids[-y.shape[1] + int(above[0])]) if above.size else window_start
    return Finding(
        kind="memory_pressure",
        severity="critical" if critical else "warning",
        ranks=tuple(ranks.tolist()),
        first_step=first_step,
        score=round(w_use, 3),
        summary=summary,
        key="memory_pressure",
        evidence=evidence,
        active=True,
        last_step=last_step,
    )


def _round(value: float) -> float:
    return float(f"{value:.4g}")


@register("memory", kinds={"memory_pressure"}, needs={"steps"})
def _detect_window(window: Window) -> list[Finding]:
    """Finds nothing until ranks report their device capacity (``mem_capacity``)."""
    w = window.steps
    assert w is not None
    if w.mem_capacity is None:
        return []
    return detect_memory(w.mem_bytes, w.mem_capacity, steps=w.steps)

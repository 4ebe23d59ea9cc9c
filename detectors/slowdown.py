"""Job slowdowns: a sustained rise in step time, and the component that caused it.

    findings = detect_slowdown(step_s, comm_s, data_s, steps=steps)

Inputs are ``(R, S)`` arrays of seconds per rank and step (or ``(S,)`` job-level series):
``step_s`` the whole step, ``comm_s`` the time in collectives, ``data_s`` the time waiting for
the data loader. The compute component is ``compute_time(step_s, comm_s) - data_s``: the
compute time of :mod:`detectors.timing` (which includes input waits) less the input waits, so
a data-loader stall is told apart from slower math. Pass zeros for a component the collector
does not measure (compute then absorbs it); a NaN ``comm_s`` counts as 0, as in
``compute_time``. Each series is reduced to the job's value per step by the cross-rank
median (of at most ``max_sample_ranks`` evenly spaced ranks: in synchronous training every
rank shares the step time, so a sample is as good as all of them).

Method: one-sided CUSUM (Page, 1954) on ``log(step time)`` against a baseline, the median of
the first valid steps: ``baseline_steps`` (20), or as many as last ``baseline_s`` (30 s) when
that is more, up to a quarter of the series (on a busy host a second of quiet between two
spells of contention is not the job's normal speed). A shift of ``min_shift`` (15%) is
``d = log(1.15)`` in log units; each step adds ``min(x - base, 3d) - d/2`` to a sum floored
at zero, so steps at the baseline drain it and a shift of ``d`` fills it by ``d/2`` per step.
It alarms at ``h = max(min_steps * d/2, 5 * sigma**2 / (d/2))`` — ``min_steps`` steps of a
15% shift, or more where the baseline is noisy (sigma: robust spread of the baseline) — and
the onset is the step after the sum last stood at zero. Capping each step at ``3d`` means a
blip shorter than ``min_steps / 5`` steps can never alarm, however tall. An alarm is
reported when the episode's lower quartile of step time is at least ``min_shift`` above the
median of the steps before it, over at least ``min_steps`` steps, and the episode has lasted
at least ``min_duration_s`` (60 s) of step time (a slowdown must be *material* — most steps
of it, not a few, ``min_shift`` slower — and *sustained*: seconds of host contention,
another process taking the cores for a moment, are not one). An episode not yet that long
is not reported (it is pending). The episode ends at the first ``min_steps`` steps in a row
back below ``base + d/2`` (``active=False``); the search then goes on for later episodes.

The view: 60 s of slow steps and a baseline before them need minutes of step time, more
than the backend's window of the last 200 steps holds when steps are short (20 s of 0.1-s
steps). ``history`` (:class:`~detectors.window.StepHistory`) carries the job's step time
over the steps before the window, one value per step (the mean over the window's first and
last rank: O(steps) to read, not O(ranks × steps)), and the window's steps are then reduced
the same way, so the view is one series without a seam. :func:`history_steps` says how many
steps the detector wants: as many as make the window and them last ``view_s`` (180 s), at
most ``max_view_steps`` (4,096) in all, none when the window alone lasts that long. Steps
shorter than ~20 ms (4,096 of them hold little more than 60 s) still cannot show a
slowdown. A slowdown that goes on becomes the view's normal: about 2.5 minutes after its
onset, once the baseline is mostly slow steps, it is no longer reported (its incident
resolves).

Attribution: the component (compute, comm, data) whose median grew most in absolute seconds
between the steps before the onset and the episode; kind ``slowdown``, key ``slowdown`` (one
job-wide step time, one slowdown at a time: the attribution may change between windows, the
incident must not), no ranks (it is the whole job), score = relative rise (0.4 = 40%).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from detectors import arrays
from detectors.arrays import as_2d_float, sample_rows
from detectors.finding import Finding
from detectors.registry import register
from detectors.timing import compute_time
from detectors.window import HISTORY_RANKS, StepHistory, StepWindow, Window

__all__ = ["COMPONENTS", "SlowdownConfig", "detect_slowdown", "history_steps"]

COMPONENTS = ("compute", "comm", "data")
_MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class SlowdownConfig:
    """Tuning for :func:`detect_slowdown`."""

    min_shift: float = 0.15
    """Smallest relative rise in step time that counts (0.15 = 15% slower)."""
    min_steps: int = 10
    """A rise must last this many steps; also the length of a recovery."""
    min_duration_s: float = 60.0
    """... and this many seconds (the sum of its step times): sustained, not a busy moment."""
    baseline_steps: int = 20
    """Valid steps at the start of the series that define the normal step time, at least ..."""
    baseline_s: float = 30.0
    """... and as many as last this long (a quarter of the series at most): on a busy host
    a second of quiet is not the job's normal speed."""
    noise_h: float = 5.0
    """Alarm threshold in units of sigma**2 / k; raises it above ``min_steps * k`` when noisy."""
    blip_cap: float = 3.0
    """Each step adds at most this many ``log(1 + min_shift)`` to the CUSUM."""
    max_sample_ranks: int = 256
    """The per-step median uses at most this many evenly spaced ranks (cost stays O(S))."""
    view_s: float = 180.0
    """The step time to judge: a window shorter than this is extended by a history (see
    :func:`history_steps`), so a baseline and ``min_duration_s`` of slow steps both fit."""
    max_view_steps: int = 4096
    """... but never more steps than this (window and history together)."""


def detect_slowdown(
    step_s: npt.ArrayLike,
    comm_s: npt.ArrayLike,
    data_s: npt.ArrayLike,
    *,
    steps: npt.ArrayLike | None = None,
    config: SlowdownConfig | None = None,
    history: StepHistory | None = None,
) -> list[Finding]:
    """Find sustained step-time rises and attribute each to compute, comm or data.

    step_s, comm_s, data_s: ``(R, S)`` or ``(S,)`` float seconds; NaN where not reported.
    steps: ``(S,)`` int, the training step of each column; default ``0..S-1``.
    history: the job's step time before those steps (its steps from ``steps[0]`` on are
    ignored); judged as one series with them, each step reduced as the history is (the
    mean over the same few ranks) rather than by the median.

    >>> t = np.r_[np.full(50, 0.50), np.full(100, 0.70)]    # 100 steps, 70 s slower
    >>> [(f.key, f.evidence["component"]) for f in detect_slowdown(t, np.full(150, 0.1),
    ...                                                           np.zeros(150))]
    [('slowdown', 'compute')]
    """
    cfg = config or SlowdownConfig()
    step_a, comm_a, data_a = (as_2d_float(a) for a in (step_s, comm_s, data_s))
    if not step_a.shape == comm_a.shape == data_a.shape:
        raise ValueError(f"shapes differ: {step_a.shape}, {comm_a.shape}, {data_a.shape}")
    n_steps = step_a.shape[1]
    step_ids = arrays.step_ids(steps, n_steps)
    if n_steps == 0 or step_a.shape[0] == 0:
        return []

    if history is None:
        series = _job_series(step_a, comm_a, data_a, cfg)
    else:
        series, step_ids = _with_history(step_a, comm_a, data_a, step_ids, history)
    valid = np.flatnonzero(np.isfinite(series["step"]) & (series["step"] > 0))
    if valid.size < cfg.baseline_steps + cfg.min_steps:
        return []
    job = {name: s[valid] for name, s in series.items()}
    findings = []
    before = np.ones(valid.size, dtype=bool)  # valid steps outside earlier episodes
    for onset, end, active in _episodes(np.log(job["step"]), cfg):
        prior = np.flatnonzero(before[:onset])
        findings.append(_finding(job, step_ids[valid], prior, onset, end, active))
        before[onset : end + 1] = False
    return findings


def history_steps(window: StepWindow, config: SlowdownConfig | None = None) -> int:
    """How many steps before ``window`` the detector wants in its history: enough that the
    two together last ``view_s`` at the window's median step time (at most
    ``max_view_steps`` in all); 0 when the window alone lasts that long.

    >>> w = StepWindow.from_arrays(steps=range(200), ranks=[0], step_time=[[0.1] * 200])
    >>> history_steps(w)      # 180 s of 0.1-s steps: 1,800, of which the window has 200
    1600
    """
    cfg = config or SlowdownConfig()
    n_ranks, n_steps = (int(n) for n in window.step_time.shape)
    if n_steps == 0 or n_ranks == 0:
        return 0
    sample = window.step_time[sample_rows(n_ranks, HISTORY_RANKS)]
    finite = sample[np.isfinite(sample) & (sample > 0)]
    if finite.size == 0:
        return 0
    want = min(cfg.max_view_steps, math.ceil(cfg.view_s / float(np.median(finite))))
    return max(0, want - n_steps)


def _job_series(
    step_a: NDArray[Any], comm_a: NDArray[Any], data_a: NDArray[Any], cfg: SlowdownConfig
) -> dict[str, NDArray[np.float64]]:
    """The job's value per step of each series: the median over a sample of the ranks."""
    rows = sample_rows(step_a.shape[0], cfg.max_sample_ranks)
    step_x, comm_x, data_x = (np.array(a[rows], dtype=np.float64) for a in (step_a, comm_a, data_a))
    return {
        "step": _median_rows(step_x),
        "compute": _median_rows(compute_time(step_x, comm_x) - data_x),
        "comm": _median_rows(comm_x),
        "data": _median_rows(data_x),
    }


def _with_history(
    step_a: NDArray[Any],
    comm_a: NDArray[Any],
    data_a: NDArray[Any],
    step_ids: NDArray[np.int64],
    history: StepHistory,
) -> tuple[dict[str, NDArray[np.float64]], NDArray[np.int64]]:
    """The history's steps before the window, then the window's, each reduced alike (the
    history's mean over a few ranks: one definition over the whole view, no seam)."""
    recent = StepHistory.from_arrays(
        steps=step_ids, step_time=step_a, comm_time=comm_a, data_time=data_a
    )
    older = np.flatnonzero(history.steps < step_ids[0])
    step, comm, data = (
        np.concatenate([getattr(history, name)[older], getattr(recent, name)])
        for name in ("step_time", "comm_time", "data_time")
    )
    comm, data = np.nan_to_num(comm), np.nan_to_num(data)
    series = {"step": step, "compute": compute_time(step, comm) - data, "comm": comm, "data": data}
    return series, np.concatenate([history.steps[older], step_ids])


def _episodes(y: NDArray[np.float64], cfg: SlowdownConfig) -> list[tuple[int, int, bool]]:
    """``(onset, end, active)`` index ranges (inclusive) of confirmed slowdowns in ``y``."""
    n = y.size
    first = _baseline(y, cfg)
    base = float(np.median(first))
    sigma = _MAD_TO_SIGMA * float(np.median(np.abs(first - base)))
    d = math.log1p(cfg.min_shift)
    k = d / 2
    h = max(cfg.min_steps * k, cfg.noise_h * sigma**2 / k)
    gain = np.minimum(y - base, cfg.blip_cap * d) - k
    elevated = (y - base) >= k
    # quiet[t]: steps t .. t+min_steps-1 are all back near the baseline (a recovery).
    run = np.concatenate([[0], np.cumsum(~elevated)])
    quiet = np.zeros(n, dtype=bool)
    w = cfg.min_steps
    if n >= w:
        quiet[: n - w + 1] = (run[w:] - run[: n - w + 1]) == w

    out: list[tuple[int, int, bool]] = []
    before = np.ones(n, dtype=bool)  # steps outside any episode, for the "before" medians
    start = 0
    while start < n:
        total = np.cumsum(gain[start:])
        floor = np.minimum(np.minimum.accumulate(total), 0.0)
        cusum = total - floor  # Page's CUSUM, S_t = max(0, S_{t-1} + g_t), in closed form
        alarms = np.flatnonzero(cusum >= h)
        if alarms.size == 0:
            break
        alarm = start + int(alarms[0])
        zeros = np.flatnonzero(cusum[: alarm - start] <= 0.0)
        onset = start + (int(zeros[-1]) + 1 if zeros.size else 0)
        recoveries = np.flatnonzero(quiet[alarm:])
        if recoveries.size:
            recovery = alarm + int(recoveries[0])
            after = np.flatnonzero(elevated[onset:recovery])
            end = onset + int(after[-1]) if after.size else alarm
        else:
            recovery, end = n, n - 1
        prior = y[:onset][before[:onset]]
        # Confirm on the episode's lower quartile: a real slowdown moves every step, while
        # clusters of one-rank pauses (GC, …) only lift the upper part of the distribution.
        low = np.percentile(y[onset : end + 1], 25)
        rise = math.expm1(low - np.median(prior)) if prior.size else 0.0
        lasted_s = float(np.exp(y[onset : end + 1]).sum())
        sustained = end - onset + 1 >= cfg.min_steps and lasted_s >= cfg.min_duration_s
        if sustained and rise >= cfg.min_shift:
            out.append((onset, end, recovery >= n))
            before[onset : end + 1] = False
        start = recovery
    return out


def _baseline(y: NDArray[np.float64], cfg: SlowdownConfig) -> NDArray[np.float64]:
    """The first steps of ``log(step time)`` ``y`` that define its normal: ``baseline_steps``,
    or as many as last ``baseline_s``, up to a quarter of the series."""
    lasted = np.cumsum(np.exp(y))
    by_time = int(np.searchsorted(lasted, cfg.baseline_s)) + 1
    return y[: max(cfg.baseline_steps, min(by_time, y.size // 4))]


def _finding(
    job: dict[str, NDArray[np.float64]],
    step_ids: NDArray[np.int64],
    prior: NDArray[np.intp],
    onset: int,
    end: int,
    active: bool,
) -> Finding:
    med_before = {name: float(np.median(s[prior])) for name, s in job.items()}
    med_after = {name: float(np.median(s[onset : end + 1])) for name, s in job.items()}
    deltas = {c: med_after[c] - med_before[c] for c in COMPONENTS}
    cause = max(COMPONENTS, key=lambda c: deltas[c])
    rise = med_after["step"] / med_before["step"] - 1.0
    onset_step, end_step = int(step_ids[onset]), int(step_ids[end])

    evidence: dict[str, Any] = {
        "onset_step": onset_step,
        "before_step_s": _round(med_before["step"]),
        "after_step_s": _round(med_after["step"]),
        "rise_pct": round(100 * rise, 1),
        "steps_slow": end - onset + 1,
        "slow_for_s": _round(float(job["step"][onset : end + 1].sum())),
        "component": cause,
    }
    for c in COMPONENTS:
        evidence[f"{c}_before_s"] = _round(med_before[c])
        evidence[f"{c}_after_s"] = _round(med_after[c])
        evidence[f"{c}_delta_s"] = _round(deltas[c])
    parts = ", ".join(f"{c} {deltas[c]:+.3g} s" for c in COMPONENTS)
    summary = (
        f"step time rose {100 * rise:.0f}% from {med_before['step']:.3g} s to "
        f"{med_after['step']:.3g} s at step {onset_step}, mostly {cause} ({parts})"
    )
    if not active:
        summary += f"; recovered after step {end_step}"
    return Finding(
        kind="slowdown",
        severity="warning",
        ranks=(),
        first_step=onset_step,
        score=round(rise, 3),
        summary=summary,
        key="slowdown",
        evidence=evidence,
        active=active,
        last_step=end_step,
    )


# --- small helpers --------------------------------------------------------------------------


def _median_rows(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """``(S,)`` median over rows of the finite entries; NaN for a column with none."""
    x = np.ascontiguousarray(x.T)  # (S, n): a median along contiguous memory is twice as fast
    finite = np.isfinite(x)
    if finite.all():  # x is our own copy: partition it in place
        n = x.shape[1]
        lo, hi = (n - 1) // 2, n // 2
        x.partition([lo, hi] if lo != hi else lo, axis=1)
        return np.asarray((x[:, lo] + x[:, hi]) / 2, dtype=np.float64)
    x[~finite] = np.nan
    empty = ~finite.any(axis=1)
    x[empty] = 0.0  # keeps nanmedian quiet; those steps are set back to NaN below
    med = np.asarray(np.nanmedian(x, axis=1), dtype=np.float64)
    med[empty] = np.nan
    return med


def _round(value: float) -> float:
    return float(f"{value:.4g}")


@register("slowdown", kinds={"slowdown"}, needs={"steps"})
def _detect_window(window: Window) -> list[Finding]:
    w = window.steps
    assert w is not None
    return detect_slowdown(
        w.step_time,
        np.nan_to_num(w.comm_time),
        np.nan_to_num(w.data_time),
        steps=w.steps,
        history=w.history,
    )

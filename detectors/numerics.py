"""Numeric blow-ups: NaN/Inf in loss or grad norm, and loss spikes.

    findings = detect_numerics(loss, grad_norm, steps=steps)

``loss`` and ``grad_norm`` are ``(R, S)`` arrays: one row per rank, one column per step of the
window (``steps[j]`` is the training step of column ``j``). ``reported`` (same shape, bool)
marks the entries a rank actually sent; entries it did not send are ignored, so the backend may
pivot missing values to NaN without raising a false NaN alarm.

Two checks:

- **Non-finite values.** Any NaN or ±Inf in a reported loss or grad norm gives one critical
  ``nan`` finding (key ``"nan"``, score = ranks affected). Its ranks are the ones non-finite
  at the *first* bad step — usually the rank that blew up before the all-reduce spread it to
  everyone — and its evidence counts every rank affected later. ``active=False`` when the last
  reported step is finite everywhere again.
- **Loss spikes.** The job's loss per step is the cross-rank median (of at most
  ``max_sample_ranks`` evenly spaced ranks: in data-parallel training the ranks train one
  model, and the median ignores one rank's odd micro-batch). An EWMA tracks its level; each
  step's residual against the previous EWMA is scaled by a robust running sigma: an
  exponentially weighted mean of absolute residuals, each clipped at ``clip_sigma`` sigma
  (Huber-type, so a spike cannot inflate its own yardstick), times sqrt(pi/2), and at least
  ``min_scale_frac`` of the level. A step spikes when ``z = residual / sigma >= z_threshold``
  after ``warmup_steps``. Only upward residuals count, and the level follows drops unclipped,
  so the steep early decline of a fresh run never fires. Spike steps at most ``merge_gap``
  steps apart form one episode; the most recent episode is reported (kind ``loss_spike``, key
  ``"loss_spike"``, score = peak z), ``active=False`` once the loss has stayed below the
  threshold for ``clear_steps`` steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from detectors import arrays
from detectors.arrays import as_2d_float
from detectors.finding import Finding
from detectors.registry import register
from detectors.window import Window

__all__ = ["NumericsConfig", "detect_numerics"]

_SIGMA = "\u03c3"  # Greek small sigma, as in "7.2 robust sigma above its EWMA"
_MAD_TO_SIGMA = 1.4826  # sigma of a normal distribution per unit of median absolute deviation
_MEAN_ABS_TO_SIGMA = math.sqrt(math.pi / 2)  # sigma per unit of mean absolute deviation


@dataclass(frozen=True)
class NumericsConfig:
    """Tuning for :func:`detect_numerics`; the defaults suit per-step LM losses."""

    z_threshold: float = 6.0
    """A step spikes when its loss is this many robust sigma above the EWMA."""
    ewma_alpha: float = 0.1
    """Weight of the newest step in the EWMA of the loss level."""
    scale_alpha: float = 0.05
    """Weight of the newest step in the running robust sigma."""
    clip_sigma: float = 3.0
    """Residuals are clipped at this many sigma before updating sigma (and, upward, the level)."""
    warmup_steps: int = 20
    """Valid steps at the start of the window used only to settle the EWMA and sigma."""
    ignore_before_step: int = 0
    """No spikes before this training step (e.g. the end of learning-rate warm-up)."""
    min_scale_frac: float = 0.01
    """Floor on sigma as a fraction of |EWMA|: at z 6 a spike is at least 6% above the level."""
    merge_gap: int = 3
    """Spike steps at most this many steps apart belong to one episode."""
    clear_steps: int = 5
    """An episode has passed after this many valid steps below the threshold."""
    max_sample_ranks: int = 256
    """The per-step median uses at most this many evenly spaced ranks (cost stays O(S))."""


def detect_numerics(
    loss: npt.ArrayLike,
    grad_norm: npt.ArrayLike | None = None,
    *,
    steps: npt.ArrayLike | None = None,
    reported: npt.ArrayLike | None = None,
    config: NumericsConfig | None = None,
    older_steps: bool = False,
) -> list[Finding]:
    """Find NaN/Inf values and loss spikes in a window of steps.

    loss: ``(R, S)`` float, per rank and step (a 1-D ``(S,)`` array is one rank).
    grad_norm: ``(R, S)`` float or ``None``; only checked for non-finite values.
    steps: ``(S,)`` int, the training step of each column; default ``0..S-1``.
    reported: ``(R, S)`` bool, ``True`` where the rank sent a value; default all.
    older_steps: the job has steps before ``steps``: NaN from the first column may have begun
    earlier, on ranks the window cannot tell (``partial_view``).

    >>> loss = np.full((4, 100), 2.0); loss[2, 40] = np.nan
    >>> [f.kind for f in detect_numerics(loss)]
    ['nan']
    """
    cfg = config or NumericsConfig()
    loss_a = as_2d_float(loss)
    n_ranks, n_steps = loss_a.shape
    step_ids = arrays.step_ids(steps, n_steps)
    mask = None if reported is None else np.asarray(reported, dtype=bool).reshape(loss_a.shape)
    grad_a = None if grad_norm is None else as_2d_float(grad_norm).reshape(loss_a.shape)
    if n_steps == 0 or n_ranks == 0:
        return []

    findings: list[Finding] = []
    nan_finding = _nonfinite(loss_a, grad_a, mask, step_ids, older_steps=older_steps)
    if nan_finding is not None:
        findings.append(nan_finding)
    level = _job_loss(loss_a, mask, cfg.max_sample_ranks)
    spike = _loss_spike(level, step_ids, cfg)
    if spike is not None:
        findings.append(spike)
    return findings


# --- non-finite values --------------------------------------------------------------------


def _bad_mask(
    values: NDArray[np.floating[Any]], mask: NDArray[np.bool_] | None
) -> NDArray[np.bool_] | None:
    """``(R, S)`` bool of reported non-finite entries, or ``None`` when there are none."""
    if mask is None and np.isfinite(values.sum()):  # one pass; a NaN or Inf poisons the sum
        return None
    bad = ~np.isfinite(values)
    if mask is not None:
        bad &= mask
    return bad if bad.any() else None


def _nonfinite(
    loss: NDArray[np.floating[Any]],
    grad: NDArray[np.floating[Any]] | None,
    mask: NDArray[np.bool_] | None,
    step_ids: NDArray[np.int64],
    *,
    older_steps: bool,
) -> Finding | None:
    present: list[tuple[str, NDArray[np.bool_], NDArray[np.floating[Any]]]] = []
    for name, values in (("loss", loss), ("grad norm", grad)):
        bad_one = None if values is None else _bad_mask(values, mask)
        if values is not None and bad_one is not None:
            present.append((name, bad_one, values))
    if not present:
        return None
    # Per-metric reductions, combined as (S,) and (R,) vectors: no (R, S) union is built.
    steps_bad = [b.any(axis=0) for _, b, _ in present]
    ranks_bad = [b.any(axis=1) for _, b, _ in present]
    bad_steps = np.logical_or.reduce(steps_bad)
    first = int(np.argmax(bad_steps))
    # The ranks to blame are those whose *loss* went bad first: the grad norm people log is
    # usually all-reduced, so it turns non-finite on every rank at once. Only when the loss
    # is still finite at that step do the grad-norm ranks stand in.
    at_first = {name: b[:, first] for name, b, _ in present}
    loss_first = at_first.get("loss")
    if loss_first is not None and loss_first.any():
        origin = np.flatnonzero(loss_first)
    else:
        origin = np.flatnonzero(np.logical_or.reduce(list(at_first.values())))
    n_affected = int(np.logical_or.reduce(ranks_bad).sum())
    last_reported = _last_reported_column(mask, loss.shape[1])
    active = any(bool(b[:, last_reported].any()) for _, b, _ in present)

    evidence: dict[str, Any] = {
        "first_step": int(step_ids[first]),
        "ranks_at_first_step": int(origin.size),
        "ranks_affected": n_affected,
        "steps_affected": int(bad_steps.sum()),
        "last_bad_step": int(step_ids[np.flatnonzero(bad_steps)[-1]]),
    }
    if first == 0 and older_steps:  # bad from the first step: the onset may be before it
        evidence["partial_view"] = "the onset is before the window"
    what = []
    for (name, b, values), cols, rows_bad in zip(present, steps_bad, ranks_bad, strict=True):
        col = int(np.argmax(cols))
        kind = _nonfinite_kind(values[np.flatnonzero(b[:, col]), col])
        slug = name.replace(" ", "_")
        evidence[f"{slug}_first_step"] = int(step_ids[col])
        evidence[f"{slug}_first_value"] = kind
        evidence[f"{slug}_ranks_affected"] = int(rows_bad.sum())
        what.append(f"{name} {kind} from step {int(step_ids[col])}")

    summary = (
        f"{' and '.join(what)}; first on {_fmt_ranks(origin)} at step {int(step_ids[first])}"
        f", {n_affected} rank{'s' if n_affected != 1 else ''} affected"
    )
    if not active:
        summary += f", finite again after step {evidence['last_bad_step']}"
    return Finding(
        kind="nan",
        severity="critical",
        ranks=tuple(origin.tolist()),
        first_step=int(step_ids[first]),
        score=float(n_affected),
        summary=summary,
        key="nan",
        evidence=evidence,
        active=active,
        last_step=int(step_ids[last_reported]) if active else evidence["last_bad_step"],
    )


def _nonfinite_kind(values: NDArray[np.floating[Any]]) -> str:
    """``"NaN"``, ``"Inf"``, ``"-Inf"`` or a mix, for a summary (JSON has no NaN)."""
    kinds = []
    if np.isnan(values).any():
        kinds.append("NaN")
    if np.isposinf(values).any():
        kinds.append("Inf")
    if np.isneginf(values).any():
        kinds.append("-Inf")
    return "/".join(kinds)


def _last_reported_column(mask: NDArray[np.bool_] | None, n_steps: int) -> int:
    if mask is None:
        return n_steps - 1
    cols = np.flatnonzero(mask.any(axis=0))
    return int(cols[-1]) if cols.size else n_steps - 1


# --- loss spikes ----------------------------------------------------------------------------


def _job_loss(
    loss: NDArray[np.floating[Any]], mask: NDArray[np.bool_] | None, max_ranks: int
) -> NDArray[np.float64]:
    """``(S,)`` cross-rank median of the finite, reported losses (NaN where there are none)."""
    n_ranks = loss.shape[0]
    rows = np.unique(np.linspace(0, n_ranks - 1, min(n_ranks, max(1, max_ranks))).astype(np.intp))
    sample = np.array(loss[rows].T, dtype=np.float64)  # (S, n): medians along contiguous rows
    invalid = ~np.isfinite(sample)
    if mask is not None:
        invalid |= ~mask[rows].T
    if not invalid.any():  # sample is our own copy: partition it in place
        n = sample.shape[1]
        lo, hi = (n - 1) // 2, n // 2
        sample.partition([lo, hi] if lo != hi else lo, axis=1)
        return np.asarray((sample[:, lo] + sample[:, hi]) / 2, dtype=np.float64)
    sample[invalid] = np.nan
    empty = invalid.all(axis=1)
    sample[empty] = 0.0  # keeps nanmedian quiet; those steps are set back to NaN below
    med = np.asarray(np.nanmedian(sample, axis=1), dtype=np.float64)
    med[empty] = np.nan
    return med


def _loss_spike(
    level: NDArray[np.float64], step_ids: NDArray[np.int64], cfg: NumericsConfig
) -> Finding | None:
    valid = np.flatnonzero(np.isfinite(level))
    if valid.size <= cfg.warmup_steps + 1:
        return None
    x = level[valid]
    warm = x[: max(cfg.warmup_steps, 2)]
    sigma0 = _MAD_TO_SIGMA * float(np.median(np.abs(np.diff(warm)))) / math.sqrt(2.0)
    ewma = float(x[0])
    mean_abs = sigma0 / _MEAN_ABS_TO_SIGMA
    alpha, beta, clip = cfg.ewma_alpha, cfg.scale_alpha, cfg.clip_sigma

    n = x.size
    z = np.zeros(n)
    ewma_before = np.empty(n)
    sigma_before = np.empty(n)
    ewma_before[0], sigma_before[0] = ewma, sigma0
    # Sequential by nature (each step's yardstick depends on the last), but O(S) scalar work.
    for i, value in enumerate(x.tolist()[1:], start=1):
        sigma = max(_MEAN_ABS_TO_SIGMA * mean_abs, cfg.min_scale_frac * abs(ewma), 1e-12)
        resid = value - ewma
        ewma_before[i], sigma_before[i] = ewma, sigma
        z[i] = resid / sigma
        ewma += alpha * min(resid, clip * sigma)
        mean_abs += beta * (min(abs(resid), clip * sigma) - mean_abs)

    eligible = np.zeros(n, dtype=bool)
    eligible[cfg.warmup_steps :] = True
    eligible &= step_ids[valid] >= cfg.ignore_before_step
    spikes = np.flatnonzero(eligible & (z >= cfg.z_threshold))
    if spikes.size == 0:
        return None

    # Episodes: runs of spike steps with gaps (in valid steps) of at most merge_gap.
    breaks = np.flatnonzero(np.diff(spikes) > cfg.merge_gap)
    start = int(spikes[breaks[-1] + 1] if breaks.size else spikes[0])
    end = int(spikes[-1])
    episodes = breaks.size + 1
    peak = start + int(np.argmax(z[start : end + 1]))
    active = (n - 1 - end) < cfg.clear_steps

    onset_step = int(step_ids[valid[start]])
    peak_step = int(step_ids[valid[peak]])
    evidence: dict[str, Any] = {
        "peak_step": peak_step,
        "peak_loss": _round(x[peak]),
        "ewma_before": _round(ewma_before[peak]),
        "robust_sigma": _round(sigma_before[peak]),
        "z": round(float(z[peak]), 2),
        "threshold_z": cfg.z_threshold,
        "spike_steps": int(((z[start : end + 1]) >= cfg.z_threshold).sum()),
        "episodes_in_window": int(episodes),
        "latest_loss": _round(x[-1]),
    }
    summary = (
        f"loss spiked to {_fmt(x[peak])} at step {peak_step}, {float(z[peak]):.1f} "
        f"robust {_SIGMA} above its EWMA of {_fmt(ewma_before[peak])}"
    )
    if not active:
        summary += f"; back below threshold after step {int(step_ids[valid[end]])}"
    return Finding(
        kind="loss_spike",
        severity="warning",
        ranks=(),
        first_step=onset_step,
        score=round(float(z[peak]), 2),
        summary=summary,
        key="loss_spike",
        evidence=evidence,
        active=bool(active),
        last_step=int(step_ids[valid[-1]]) if active else int(step_ids[valid[end]]),
    )


# --- small helpers --------------------------------------------------------------------------


def _round(value: float | np.floating[Any]) -> float:
    return float(f"{float(value):.4g}")


def _fmt(value: float | np.floating[Any]) -> str:
    return f"{float(value):.3g}"


def _fmt_ranks(ranks: NDArray[np.intp], limit: int = 6) -> str:
    """``rank 5`` · ``ranks 0, 5, 7`` · ``1024 ranks (0, 1, 2, 3, 4, 5, …)``."""
    shown = ", ".join(str(int(r)) for r in ranks[:limit])
    if ranks.size == 1:
        return f"rank {shown}"
    if ranks.size <= limit:
        return f"ranks {shown}"
    return f"{ranks.size} ranks ({shown}, …)"


@register("numerics", kinds={"nan", "loss_spike"}, needs={"steps"})
def _detect_window(window: Window) -> list[Finding]:
    w = window.steps
    assert w is not None
    # Unsent grad norms must not read as NaN: only non-finite *reported* ones count.
    grad = np.where(w.grad_reported, w.grad_norm, 0.0)
    return detect_numerics(
        w.loss, grad, steps=w.steps, reported=w.loss_reported, older_steps=w.older_steps
    )

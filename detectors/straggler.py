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
   Once each rank's normal is known (step 2), the quartile is taken again over the ranks
   that are not slow (under the hold level of step 4): with a third of the job slow, the
   quartile of all ranks is the fast ranks' 37th percentile, a third of their spread
   higher, and would make a 1.10x group look 1.09x.
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
   slow (1.4826 · MAD about the reference level 1 of the ratios under the hold level ``1 +
   hold_share · rel_threshold``, at least ``scale_floor``): a slow group, even one 1.10x
   slower whose ranks straddle the threshold, does not widen the yardstick.
   A step is *over threshold* for a rank when its corrected ratio exceeds
   ``1 + max(rel_threshold, z_threshold · scale)``: at least 10% slower than its normal
   (tiny absolute differences never fire) and an outlier given the spread of the other
   ranks at that step (noisy jobs need a larger gap).
4. Persistence: a rank fires while at least ``persist_k`` of its last ``persist_m`` steps are
   over threshold (missing steps keep the rank's previous state). **Hysteresis**: once it
   fires, it keeps firing until ``persist_k`` of its last ``persist_m`` steps are under the
   *hold level*, ``1 + hold_share · margin`` with the window's median margin: 1 +
   rel_threshold / 2 (5% slower than its normal) where the ranks' spread does not widen
   the threshold (a step over the threshold is always at the hold level). A group
   1.10–1.15x slower sits right at the threshold and crosses it on some steps only; without
   hysteresis each of its ranks would stop and fire again and again, an incident re-opened
   each time. A 1.07x rank that never crossed the threshold still does not fire: the hold
   level only keeps an episode going. A run of firing steps is an episode. Its onset: the
   first over-threshold step of the steps that met the persistence rule, moved back to
   where the rank's run of steps at the hold level began. Its last step: the last step at
   the hold level from its last over-threshold step on, before a gap of ``persist_m -
   persist_k`` steps under it (a recovered rank's isolated noisy steps do not prolong it).
   An episode still firing at the window's last step is ``active``; one that ended inside
   the window is reported with ``active=False`` and ``last_step``.
5. Material, not blips: an episode is reported once it cost the job ``min_cost_s`` (0.5 s)
   — the rank's compute beyond its normal, summed over the episode, which is what the other
   ranks waited for it. A short one (under ``blip_steps`` steps from its onset to its last
   over-threshold step: the hysteresis tail does not count) must also cost
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

Everything is vectorized over ranks and steps: steps 1–3 in :mod:`detectors.straggler_ratio`,
the episode bookkeeping of the ranks that fired over their (ranks x steps) block at once in
:mod:`detectors.straggler_episodes`; only the findings themselves are built one by one
(:mod:`detectors.straggler_finding`).
16,384 ranks x 200 steps take a few tens of ms, and about 0.1 s with 4,096 of them slow
(``bench/detector_scale.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from detectors.finding import Finding
from detectors.registry import register
from detectors.robust import nanmedian_rows
from detectors.straggler_episodes import (
    Block,
    carry_forward,
    evidence_stats,
    hold,
    latest,
    material,
    noisy_host,
)
from detectors.straggler_finding import finding
from detectors.straggler_ratio import (
    baselines,
    compute_by_step,
    head,
    majority_level,
    majority_scale,
    pair_scale,
    ratio_to_reference,
    validate,
)
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
    critical_ratio: slowdown (vs the reference, median over the episode's steps over the
        threshold) from which a finding is ``critical``.
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
    hold_share: hysteresis. A firing rank keeps firing until ``persist_k`` of its last
        ``persist_m`` steps are under ``1 + hold_share · margin`` (the window's median
        margin ``max(rel_threshold, z_threshold · scale)``): with the defaults, 5% slower
        than its normal in a quiet job. Ranks under ``1 + hold_share · rel_threshold`` are
        the "not slow" ones the reference and the scale are taken from (steps 1 and 3).
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
    hold_share: float = 0.5

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
        if not 0.0 < self.hold_share <= 1.0:
            raise ValueError("need 0 < hold_share <= 1")


DEFAULT_CONFIG = StragglerConfig()


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
    prep = _prepare(steps, step_time, comm_time, ranks, baseline, config)
    return [] if prep is None else _report(prep, config)


@dataclass(frozen=True)
class _Prepared:
    """A window judged up to its episodes: the ranks that fired, as a :class:`Block`, and
    what their findings' evidence is read from."""

    step_ids: IntArray
    rank_ids: IntArray
    times: FloatArray
    comm: FloatArray | None
    pairwise: bool
    reference: FloatArray  # (S,), or (S, 2) for two ranks: each rank's reference
    scale: FloatArray
    margin: FloatArray
    block: Block


def _prepare(
    steps: npt.ArrayLike,
    step_time: npt.ArrayLike,
    comm_time: npt.ArrayLike | None,
    ranks: npt.ArrayLike | None,
    baseline: npt.ArrayLike | None,
    cfg: StragglerConfig,
) -> _Prepared | None:
    """Steps 1–4 of the module's method, vectorized over ranks and steps; None when no
    rank fired."""
    step_ids, times, comm, rank_ids, base_in = validate(
        steps, step_time, comm_time, ranks, baseline
    )
    n_ranks, n_steps = times.shape
    pairwise = n_ranks == 2
    if (n_ranks < cfg.min_ranks and not pairwise) or n_steps == 0:
        return None

    ratio, reference = ratio_to_reference(times, comm, pairwise, cfg)

    # 2. Each rank's normal ratio, and the ratio corrected by it.
    base = baselines(ratio, base_in, cfg)
    adj = ratio  # alias: corrected in place to keep one (S x R) buffer
    adj /= base.astype(np.float32)[None, :]
    if not pairwise:  # the reference among the ranks that are not slow
        level = majority_level(adj, base, cfg)
        adj /= level.astype(np.float32)[:, None]
        reference = reference * level

    # 3. Per-step robust scale of the corrected ratios; slow steps.
    scale = pair_scale(adj, cfg) if pairwise else majority_scale(adj, cfg)
    margin = np.maximum(cfg.rel_threshold, cfg.z_threshold * scale)
    valid = np.isfinite(adj)
    over = adj >= (1.0 + margin).astype(np.float32)[:, None]  # NaN compares False

    # 4. Persistence: k of the last m steps; a missing step carries the previous state.
    held = carry_forward(over, valid, axis=0)
    count = np.zeros((n_steps, n_ranks), dtype=np.uint8)
    for lag in range(min(cfg.persist_m, n_steps)):
        count[lag:] += held[: n_steps - lag]
    firing = count >= cfg.persist_k
    cols = np.flatnonzero(firing.any(axis=0))
    if not cols.size:
        return None

    # From here on only the ranks that fired, one row per rank: (F x S).
    def rows(by_step: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return np.ascontiguousarray(by_step[:, cols].T)

    seen = rows(valid)
    corrected = rows(adj).astype(np.float64)
    over_rows = rows(over)  # over the threshold is at the hold level, whatever the step's margin
    kept = over_rows | (corrected >= np.float32(1.0 + cfg.hold_share * float(np.median(margin))))
    kept_held = carry_forward(kept, seen, axis=1)
    ref_rows = (
        reference[:, cols].T if pairwise else np.broadcast_to(reference, (cols.size, n_steps))
    )
    block = Block(
        cols=cols,
        firing=hold(rows(firing), kept_held, cfg),
        over=over_rows,
        held=rows(held),
        kept=kept,
        kept_held=kept_held,
        valid=seen,
        adj=corrected,
        base=base[cols],
        own=compute_time(times[cols], None if comm is None else comm[cols]),
        step=times[cols],
        reference=np.ascontiguousarray(ref_rows),
    )
    return _Prepared(step_ids, rank_ids, times, comm, pairwise, reference, scale, margin, block)


def _report(prep: _Prepared, cfg: StragglerConfig) -> list[Finding]:
    """Steps 5–6 and the findings: each fired rank's most recent material episode."""
    block = prep.block
    found = material(block, cfg)
    ep, earlier = latest(found)
    if ep.rows.size > 1 or (prep.pairwise and ep.rows.size):
        # 6. More than one rank had an episode in this window (a noisy host, or several slow
        # ranks), or there are only two ranks, whose ratio carries both ranks' noise: only
        # episodes that lasted ``noisy_min_s`` seconds of step time (or cost enough) count.
        step_s = nanmedian_rows(np.ascontiguousarray(block.step[ep.rows].T))
        ep, earlier = latest(noisy_host(found, ep.rows, step_s, cfg))
    if not ep.rows.size:
        return []
    if prep.pairwise:
        median = block.reference[ep.rows]  # the other rank's compute time
    else:  # the evidence's median rank, computed only when a rank is reported
        by_step = nanmedian_rows(compute_by_step(prep.times, prep.comm), overwrite=True)
        median = np.broadcast_to(by_step, (ep.rows.size, by_step.size))
    stats = evidence_stats(block, ep, scale=prep.scale, margin=prep.margin, median=median)
    values = {k: v.tolist() for k, v in stats.items()}  # Python floats: cheaper one by one
    findings = [finding(prep, ep, earlier, values, i, cfg) for i in range(ep.rows.size)]
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
    _, times, comm, _, _ = validate(steps, step_time, comm_time, None, None)
    n_ranks, n_steps = times.shape
    pairwise = n_ranks == 2
    out = np.full(n_ranks, np.nan)
    if (n_ranks < cfg.min_ranks and not pairwise) or n_steps < cfg.baseline_steps:
        return out
    ratio, _ = ratio_to_reference(times[:, : cfg.baseline_steps], head(comm, cfg), pairwise, cfg)
    enough = np.isfinite(ratio).sum(axis=0) * 2 >= cfg.baseline_steps
    base = baselines(ratio, None, cfg)
    out[enough] = base[enough]
    return out


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

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
   The backend learns it once per run and attempt (:func:`learn_baselines`, from the first
   ``learn_steps`` steps: more precise than 20) and passes it back to every later window,
   so a slowdown that lasts thousands of steps is not absorbed once the window has slid
   past its onset.
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
   **Named already** (``named_since=``: the caller's open incidents): each window is judged
   afresh, so a rank slower by about the threshold would have to cross it again in every
   window. A rank named from step X fired there: its episode goes on, from X, while it
   stays at the hold level, as if this window had seen it fire; it needs no step over the
   threshold in this window, and is held back neither as a blip (5) nor as a noisy host's
   (6). **Groups** (:mod:`detectors.straggler_group`): at least ``group_ranks`` ranks whose
   episodes are still going and began within ``group_steps`` steps of one another are one
   cause, not a noisy host; a rank that moved to the hold level at a group's onset and
   stayed there (its median since then ``join_z`` standard errors above its normal) is
   one of it, judged at the hold level from then on (evidence ``joined_group``).
5. Material, not blips: an episode is reported once it cost the job ``min_cost_s`` (0.5 s)
   — the rank's compute beyond its normal, summed over the episode, which is what the other
   ranks waited for it. A short one (under ``blip_steps`` steps from its onset to its last
   over-threshold step: the hysteresis tail does not count) must also cost
   ``blip_share`` (10%) of its step time, and once over, have been ``blip_ratio`` (1.3x)
   slower. On a busy host the OS takes a rank's core for a moment: 14 ms more on a 5 ms
   compute inside 20 ms steps, for 8 steps, is that, not a straggler; a rank 0.15 s slower
   per step costs 0.5 s within 4 steps and is reported as soon as persistence allows.
   A group's episodes count their cost together (the compute its ranks lost to one cause)
   and are no blips.
6. A noisy host: when more than one rank has an episode in the window (on a busy 2-core
   machine the OS takes one rank's core, then another's, for a second or two at a time),
   and always with two ranks, an episode is reported once it lasted ``noisy_min_s`` (10 s)
   of step time or cost ``noisy_min_cost_s`` (3 s: what the other ranks waited for it), so
   contention is not a parade of stragglers while a real one, which lasts or costs, still
   shows. One straggler among quiet ranks is reported as soon as step 4 allows; so are a
   group's ranks, and a rank named already stays reported.

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
:mod:`detectors.straggler_episodes` (groups in :mod:`detectors.straggler_group`); only the
findings themselves are built one by one (:mod:`detectors.straggler_finding`).
16,384 ranks x 200 steps take a few tens of ms, and about 0.1 s with 4,096 of them slow
(``bench/detector_scale.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from detectors.finding import Finding
from detectors.registry import register
from detectors.straggler_config import DEFAULT_CONFIG, StragglerConfig
from detectors.straggler_episodes import Block, Episodes, carry_forward, hold, material
from detectors.straggler_finding import report
from detectors.straggler_group import joiners
from detectors.straggler_ratio import (
    baselines,
    majority_level,
    majority_scale,
    pair_scale,
    per_rank,
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


def detect_stragglers(
    steps: npt.ArrayLike,
    step_time: npt.ArrayLike,
    comm_time: npt.ArrayLike | None = None,
    ranks: npt.ArrayLike | None = None,
    *,
    baseline: npt.ArrayLike | None = None,
    named_since: npt.ArrayLike | None = None,
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
    named_since: (R,) for each rank named a straggler by an earlier window and not resolved
        since (the caller's open incidents), the step it is named from; NaN for the others.
        Such a rank's episode goes on while it stays at the hold level (step 4), and is not
        held back as a noisy host's (step 6). Default: none.

    Returns one ``Finding`` (kind ``straggler``, key ``straggler:<rank>``) per rank with an
    episode in the window, the most recent episode, highest score first.
    """
    prep = _prepare(steps, step_time, comm_time, ranks, baseline, config, named_since)
    return [] if prep is None else report(prep, config)


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
    episodes: Episodes | None = None  # the block's (``material``), where already known


def _prepare(
    steps: npt.ArrayLike,
    step_time: npt.ArrayLike,
    comm_time: npt.ArrayLike | None,
    ranks: npt.ArrayLike | None,
    baseline: npt.ArrayLike | None,
    cfg: StragglerConfig,
    named_since: npt.ArrayLike | None = None,
) -> _Prepared | None:
    """Steps 1–4 of the module's method, vectorized over ranks and steps; None when no
    rank fired."""
    step_ids, times, comm, rank_ids, base_in = validate(
        steps, step_time, comm_time, ranks, baseline
    )
    since = per_rank(named_since, "named_since", times.shape[0])
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
    held, firing = _persistent(over, valid, cfg)
    carried = since <= step_ids[0]  # named since before this window (NaN compares False)
    cols = np.flatnonzero(firing.any(axis=0) | np.isfinite(since))
    if not cols.size:
        return None
    at_hold = np.float32(1.0 + cfg.hold_share * float(np.median(margin)))  # the hold level

    def block_of(cols: IntArray, joined: BoolArray) -> Block:
        """Only the ranks that fired from here on, one row per rank: (F x S)."""

        def rows(by_step: npt.NDArray[Any]) -> npt.NDArray[Any]:
            return np.ascontiguousarray(by_step[:, cols].T)

        seen, corrected, over_rows = rows(valid), rows(adj).astype(np.float64), rows(over)
        kept = over_rows | (corrected >= at_hold)  # over the threshold is at the hold level
        kept_held = carry_forward(kept, seen, axis=1)
        ref_rows = (
            reference[:, cols].T if pairwise else np.broadcast_to(reference, (cols.size, n_steps))
        )
        named = np.isfinite(since[cols])
        named_col = np.where(named, np.searchsorted(step_ids, since[cols]), n_steps)
        fire, seed = hold(rows(firing), kept_held, named_col, cfg)
        return Block(
            cols=cols,
            firing=fire,
            over=over_rows,
            held=rows(held),
            kept=kept,
            kept_held=kept_held,
            valid=seen,
            adj=corrected,
            base=base[cols],
            carried=carried[cols],
            named_col=named_col,
            seed=seed,
            since=since[cols],
            joined=joined,
            own=compute_time(times[cols], None if comm is None else comm[cols]),
            step=times[cols],
            reference=np.ascontiguousarray(ref_rows),
        )

    block = block_of(cols, np.zeros(cols.size, dtype=bool))
    if pairwise:
        return _Prepared(step_ids, rank_ids, times, comm, True, reference, scale, margin, block)
    episodes = material(block, cfg)
    join, since_col = joiners(episodes, block, adj, at_hold, float(np.nanmedian(scale)), cfg)
    if join.size:  # ranks that turned slow with a group: judged at the hold level since
        after = np.arange(n_steps)[:, None] >= since_col[None, :]
        over[:, join] |= after & (adj[:, join] >= at_hold)
        held[:, join], firing[:, join] = _persistent(over[:, join], valid[:, join], cfg)
        cols = np.union1d(cols, join)
        block = block_of(cols, np.isin(cols, join))
        episodes = material(block, cfg)
    return _Prepared(
        step_ids, rank_ids, times, comm, False, reference, scale, margin, block, episodes
    )


def _persistent(
    over: BoolArray, valid: BoolArray, cfg: StragglerConfig
) -> tuple[BoolArray, BoolArray]:
    """(S x R) ``over`` with a missing step carrying the previous state, and where at least
    ``persist_k`` of the last ``persist_m`` steps are (step 4's persistence rule)."""
    held = carry_forward(over, valid, axis=0)
    n_steps = over.shape[0]
    count = np.zeros(over.shape, dtype=np.uint8)
    for lag in range(min(cfg.persist_m, n_steps)):
        count[lag:] += held[: n_steps - lag]
    firing: BoolArray = count >= cfg.persist_k
    return held, firing


def learn_baselines(
    steps: npt.ArrayLike,
    step_time: npt.ArrayLike,
    comm_time: npt.ArrayLike | None = None,
    *,
    config: StragglerConfig = DEFAULT_CONFIG,
) -> FloatArray:
    """Each rank's normal ratio to the reference, learned from the window's first
    ``learn_steps`` steps (capped at ``max_baseline_ratio``, floored at 1), for a caller
    that keeps it across windows and passes it back as ``baseline=``: once the window has
    slid past the onset of a slowdown that lasts, its own first steps would be slow ones and
    absorb it. The median of ``learn_steps`` steps, not of the ``baseline_steps`` a window
    estimates from: a normal 2% off by chance would put a rank of a group 1.10x slower at
    the hold level, not over it. Unless the two differ by ``hold_share · rel_threshold``
    or more: a rank that turned slow inside those steps keeps its first steps' normal.
    NaN for a rank with fewer than half of the steps reported, and for every rank while the
    window has fewer than ``learn_steps`` steps (the window estimates its own until then).
    """
    cfg = config
    _, times, comm, _, _ = validate(steps, step_time, comm_time, None, None)
    n_ranks, n_steps = times.shape
    pairwise = n_ranks == 2
    out = np.full(n_ranks, np.nan)
    n = cfg.learn_steps
    if (n_ranks < cfg.min_ranks and not pairwise) or n_steps < n:
        return out
    head = None if comm is None else comm[:, :n]
    ratio, _ = ratio_to_reference(times[:, :n], head, pairwise, cfg)
    enough = np.isfinite(ratio).sum(axis=0) * 2 >= n
    first = baselines(ratio, None, cfg)  # (baselines reads the first baseline_steps)
    whole = baselines(ratio, None, replace(cfg, baseline_steps=n))
    moved = np.abs(whole - first) >= cfg.hold_share * cfg.rel_threshold
    base = np.where(moved, first, whole)
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
        named_since=w.straggler_since,
    )

"""Straggler episodes over the ranks that fired, vectorized: hysteresis, runs of firing
steps, their onsets and ends, the materiality rules, and each reported episode's evidence
statistics. :mod:`detectors.straggler` states the rules and builds the findings; this
module applies the rules to a (fired ranks x steps) :class:`Block` with numpy, without a
Python loop per rank (a group of 4,096 slow ranks among 16,384 costs tens of ms, not s).

    >>> import numpy as np
    >>> from detectors.straggler_episodes import runs
    >>> runs(np.array([[0, 1, 1, 0, 1], [1, 0, 0, 0, 0]], dtype=bool))
    (array([0, 0, 1]), array([1, 4, 0]), array([2, 4, 0]))

Every per-episode quantity is read off per-row prefix sums and running maxima/minima of
the masks ("the last over-threshold step at or before t"), gathered at each run's indices.
Sums over an episode come from prefix sums, so they may differ from a direct sum in the last
bits: nothing is reported at that precision, and only a cost within rounding of a threshold
could be judged the other way.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from detectors.robust import nanmedian_rows

if TYPE_CHECKING:
    from detectors.straggler import StragglerConfig

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
I32Array = npt.NDArray[np.int32]
BoolArray = npt.NDArray[np.bool_]

__all__ = [
    "Block",
    "Episodes",
    "carry_forward",
    "evidence_stats",
    "hold",
    "k_of_m",
    "latest",
    "material",
    "newest",
    "noisy_host",
    "runs",
]


@dataclass(frozen=True)
class Block:
    """The ranks that fired, one row per rank, one column per step of the window."""

    cols: IntArray  # (F,) their columns in the window (rows of ``step_time``)
    firing: BoolArray  # (F, S) the persistence rule, with hysteresis
    over: BoolArray  # observed over the threshold
    held: BoolArray  # ``over``, a missing step carrying the previous state
    kept: BoolArray  # observed at or above the hold level
    kept_held: BoolArray  # ``kept``, carried the same way
    valid: BoolArray  # observed at all
    adj: FloatArray  # ratio to the reference over the rank's normal ratio
    base: FloatArray  # (F,) the rank's normal ratio
    carried: BoolArray  # (F,) named already, since before the window: its episode goes on
    named_col: IntArray  # (F,) the column it is named from (0 if before; S if not named)
    seed: IntArray  # (F,) where a named rank's episode fired (S if not named): ``hold``
    since: FloatArray  # (F,) the step it is named from (NaN: not named)
    joined: BoolArray  # (F,) one of a group, judged at the hold level (``straggler_group``)
    own: FloatArray  # (F, S) its compute time
    step: FloatArray  # its step time
    reference: FloatArray  # the reference compute time it is compared with


@dataclass(frozen=True)
class Episodes:
    """Episodes of a block's rows, row by row and in step order: the step indices of the
    onset, the last slow step, the first and the last firing step; the cost (seconds the
    other ranks waited); whether it cost under ``min_cost_s`` (alone, or with the rest of
    its group), whether it is a short blip (noise, unless one of a group), and whether it is
    one of a group (:func:`detectors.straggler_group.mark_groups`)."""

    rows: IntArray
    onset: IntArray
    last: IntArray
    detected: IntArray
    end: IntArray
    cost: FloatArray
    cheap: BoolArray
    blip: BoolArray
    group: BoolArray

    def subset(self, keep: BoolArray | IntArray) -> Episodes:
        return Episodes(**{f.name: getattr(self, f.name)[keep] for f in fields(self)})


def carry_forward(mask: BoolArray, valid: BoolArray, *, axis: int) -> BoolArray:
    """``mask`` with each missing step (``~valid``) holding the previous step's state
    (False before any) along ``axis``, the step axis of a 2-D array."""
    if valid.all():
        return mask
    held = mask.copy()
    by_step, gaps = (held, ~valid) if axis == 0 else (held.T, (~valid).T)
    for s in np.flatnonzero(gaps[1:].any(axis=1)) + 1:
        np.copyto(by_step[s], by_step[s - 1], where=gaps[s])
    return held


def k_of_m(mask: BoolArray, k: int, m: int, *, set_before: BoolArray | None = None) -> BoolArray:
    """Per row (axis 1): at least ``k`` of the last ``m`` steps are set; for the rows of
    ``set_before``, the steps before the first count as set."""
    n = mask.shape[1]
    count = np.zeros(mask.shape, dtype=np.uint8)
    for lag in range(min(m, n)):
        count[:, lag:] += mask[:, : n - lag]
    if set_before is not None and set_before.any():
        pad = np.arange(m - 1, 0, -1, dtype=np.uint8)[:n]  # steps before the window in view
        count[set_before, : pad.size] += pad
    out: BoolArray = count >= k
    return out


def hold_needs(cfg: StragglerConfig) -> int:
    """Steps of the last ``persist_m`` at the hold level that keep a firing rank firing."""
    return min(cfg.persist_k, cfg.persist_m - cfg.persist_k + 1)


def hold(
    firing: BoolArray, kept_held: BoolArray, named_col: IntArray, cfg: StragglerConfig
) -> tuple[BoolArray, IntArray]:
    """Hysteresis, per row: once the persistence rule fired, a row keeps firing until
    ``persist_k`` of its last ``persist_m`` steps are below the hold level (it needs
    :func:`hold_needs` of them at it). Steps over the threshold are at the hold level, so
    this only ever extends a firing run.

    A rank named already (``named_col``: the column of the step it is named from, 0 if
    before the window; the row length if it is not named) fired there, whether or not it
    crosses the threshold in this window, and keeps firing from there on the same terms,
    the steps before counting as at the hold level: it was firing then. Returns the firing
    mask and the (F,) *seeds*, the steps where a named rank's episode fired (the first of
    the ``persist_m`` from ``named_col`` at which the rule holds; the row length if none)."""
    m = cfg.persist_m
    n = kept_held.shape[1]
    idx = np.arange(n, dtype=np.int32)[None, :]
    col = named_col[:, None]
    named = named_col < n
    before = named[:, None] & (idx >= col - m + 1) & (idx < col)
    kept = kept_held | before if before.any() else kept_held
    keep = k_of_m(kept, hold_needs(cfg), m, set_before=named & (named_col < m - 1))
    reach = (idx >= col) & (idx < col + m) & keep
    seed = np.where(reach.any(axis=1), reach.argmax(axis=1), n)
    starts = keep.copy()
    starts[:, 1:] &= ~keep[:, :-1]
    last_start = np.maximum.accumulate(np.where(starts, idx, np.int32(-1)), axis=1)
    fired = firing | (idx == seed[:, None])
    last_fire = np.maximum.accumulate(np.where(fired, idx, np.int32(-1)), axis=1)
    out: BoolArray = keep & (last_fire >= last_start)
    return out, seed


def runs(mask: BoolArray) -> tuple[IntArray, IntArray, IntArray]:
    """(row, first, last) step indices of every run of set steps, row by row, in order."""
    n_rows, n = mask.shape
    padded = np.zeros((n_rows, n + 2), dtype=bool)
    padded[:, 1:-1] = mask
    rows, pos = np.nonzero(padded[:, 1:] != padded[:, :-1])
    return rows[0::2], pos[0::2], pos[1::2] - 1


def material(block: Block, cfg: StragglerConfig) -> Episodes:
    """Every episode of the block that is evidence enough, those that cost too little
    (``cheap``) and short blips (``blip``) marked: steps 4 and 5 of ``detectors.straggler``'s
    method (the noisy-host rule is :func:`noisy_host`)."""
    row, start, end = runs(block.firing)
    n = block.firing.shape[1]
    over, held = block.over, block.held

    # Onset: the first over-threshold step (else carried one) of the steps that met the
    # persistence rule, moved back to where its run of steps at the hold level began.
    window = np.maximum(start - cfg.persist_m + 1, 0)
    lead = window[:, None] + np.arange(cfg.persist_m)[None, :]
    in_lead = lead <= start[:, None]
    lead = np.minimum(lead, n - 1)
    hit = over[row[:, None], lead] & in_lead
    carried = ~hit.any(axis=1)
    if carried.any():
        hit[carried] = held[row[carried, None], lead[carried]] & in_lead[carried]
    first = window + hit.argmax(axis=1)
    onset = _previous(~block.kept_held)[row, first].astype(np.int64) + 1
    # A named rank's episode goes on from the step it is named from.
    goes_on = (start <= block.seed[row]) & (block.seed[row] <= end)
    onset[goes_on] = block.named_col[row[goes_on]]
    # Core: up to the last over-threshold step. Last: the last step at the hold level from
    # there on, before ``persist_m - persist_k`` steps in a row under it.
    core_last = np.maximum(_last_in(over, held, row, onset, end), onset)
    after = np.minimum(core_last + 1, n - 1)
    run_end = np.clip(_next(_gap_starts(block.kept_held, cfg))[row, after] - 1, core_last, end)
    last = np.maximum(_previous(block.kept)[row, run_end], core_last)

    def span_sum(values: npt.NDArray[np.generic]) -> FloatArray:
        cum = np.zeros((values.shape[0], n + 1))
        np.cumsum(values, axis=1, out=cum[:, 1:])
        out: FloatArray = cum[row, last + 1] - cum[row, onset]
        return out

    excess = np.clip(block.own - block.reference * block.base[:, None], 0.0, None)
    cost = span_sum(np.nan_to_num(excess))
    # Evidence: ``persist_k`` steps over the threshold, or, for the episode a rank is named
    # for already, the evidence it was named on.
    keep = (span_sum(over) >= cfg.persist_k) | goes_on
    cheap = cost < cfg.min_cost_s  # immaterial (so far), unless one of a group's

    # A short blip, mild and over or cheap, is noise (so far); not once the rank is named
    # for it: a cost share right at ``blip_share`` would name it and drop it in turn.
    named = last >= block.named_col[row]
    short = keep & (core_last - onset + 1 < cfg.blip_steps) & ~named
    blip = np.zeros(row.size, dtype=bool)
    if short.any():
        cols = onset[short, None] + np.arange(cfg.blip_steps)[None, :]
        inside = cols <= core_last[short, None]
        cols = np.minimum(cols, n - 1)
        r = row[short, None]
        values = np.where(inside & block.valid[r, cols], block.adj[r, cols], np.nan)
        peak = nanmedian_rows(values, overwrite=True)
        own_span = span_sum(np.nan_to_num(block.step))[short]
        ended = end[short] < n - 1
        blip[short] = ((peak < cfg.blip_ratio) & ended) | (cost[short] < cfg.blip_share * own_span)
    group = np.zeros(row.size, dtype=bool)
    return Episodes(row, onset, last, start, end, cost, cheap, blip, group).subset(keep)


def noisy_host(ep: Episodes, block: Block, step_s: FloatArray, cfg: StragglerConfig) -> Episodes:
    """Step 6 of the method: the episodes ``ep`` that lasted ``noisy_min_s`` seconds of
    ``step_s`` (the (S,) step time) or cost ``noisy_min_cost_s``; or that need not: one of a
    group, or one of a rank named already that reaches the step it is named from."""
    cum = np.concatenate(([0.0], np.cumsum(np.nan_to_num(step_s))))
    lasted = cum[ep.last + 1] - cum[ep.onset]
    sustained = (lasted >= cfg.noisy_min_s) | (ep.cost >= cfg.noisy_min_cost_s)
    named = ep.last >= block.named_col[ep.rows]
    return ep.subset(sustained | named | ep.group)


def newest(ep: Episodes) -> BoolArray:
    """Which episodes are their row's most recent."""
    is_last = np.ones(ep.rows.size, dtype=bool)
    is_last[:-1] = ep.rows[1:] != ep.rows[:-1]
    return is_last


def latest(ep: Episodes) -> tuple[Episodes, dict[int, list[tuple[int, int]]]]:
    """Each row's most recent episode; and per row, the (onset, last) of its earlier ones."""
    is_last = newest(ep)
    earlier: dict[int, list[tuple[int, int]]] = {}
    for i in np.flatnonzero(~is_last).tolist():
        earlier.setdefault(int(ep.rows[i]), []).append((int(ep.onset[i]), int(ep.last[i])))
    return ep.subset(is_last), earlier


def evidence_stats(
    block: Block, ep: Episodes, *, scale: FloatArray, margin: FloatArray, median: FloatArray
) -> dict[str, FloatArray]:
    """Per reported episode, the medians its finding shows, over its steps from onset to
    last (observed ones): the (E, S) ``median`` compute time of the ranks, the reference,
    the rank's compute time, its corrected ratio and the same times its normal, the
    z-score against the per-step ``scale``, and the threshold's ``margin``; the ratio over
    the steps over the threshold alone (``over_ratio``); step counts."""
    if not ep.rows.size:
        return {}
    lo, hi = int(ep.onset.min()), int(ep.last.max()) + 1  # the steps any episode covers
    r, steps = ep.rows[:, None], np.arange(lo, hi)[None, :]
    inside = (steps >= ep.onset[:, None]) & (steps <= ep.last[:, None])
    seen = inside & block.valid[r, steps]
    corrected = block.adj[r, steps]

    def med(values: FloatArray, mask: BoolArray = seen) -> FloatArray:
        return nanmedian_rows(np.where(mask, values, np.nan), overwrite=True)

    return {
        "median_compute": med(median[:, lo:hi]),
        "reference": med(block.reference[r, steps]),
        "rank_compute": med(block.own[r, steps]),
        "ratio": med(corrected * block.base[r]),
        "over_ratio": med(corrected * block.base[r], seen & block.over[r, steps]),
        "corrected": med(corrected),
        "score": med((corrected - 1.0) / scale[None, lo:hi]),
        "margin": med(np.broadcast_to(margin[lo:hi], inside.shape), inside),
        "over": (block.over[r, steps] & inside).sum(axis=1).astype(np.float64),
        "observed": seen.sum(axis=1).astype(np.float64),
    }


def _next(mask: BoolArray) -> I32Array:
    """Per row and step t: the first set step at or after t (the row length if none)."""
    n = mask.shape[1]
    at = np.where(mask, np.arange(n, dtype=np.int32)[None, :], np.int32(n))
    out: I32Array = np.minimum.accumulate(at[:, ::-1], axis=1)[:, ::-1]
    return out


def _previous(mask: BoolArray) -> I32Array:
    """Per row and step t: the last set step at or before t (-1 if none)."""
    at = np.where(mask, np.arange(mask.shape[1], dtype=np.int32)[None, :], np.int32(-1))
    out: I32Array = np.maximum.accumulate(at, axis=1)
    return out


def _gap_starts(kept_held: BoolArray, cfg: StragglerConfig) -> BoolArray:
    """Per row and step t: t begins ``persist_m - persist_k`` (at least 1) steps in a row
    below the hold level: more misses than the persistence rule lets pass in a row."""
    gap = max(1, cfg.persist_m - cfg.persist_k)
    n = kept_held.shape[1]
    cum = np.zeros((kept_held.shape[0], n + 1), dtype=np.int64)
    np.cumsum(kept_held, axis=1, out=cum[:, 1:])
    hi = np.minimum(np.arange(n) + gap, n)
    out: BoolArray = (cum[:, hi] - cum[:, :n] == 0) & (hi - np.arange(n) == gap)[None, :]
    return out


def _last_in(
    observed: BoolArray, carried: BoolArray, row: IntArray, lo: IntArray, hi: IntArray
) -> IntArray:
    """Per run: the last ``observed`` step in ``lo..hi``, else the last ``carried`` one."""
    last = _previous(observed)[row, hi].astype(np.int64)
    none = last < lo
    if none.any():
        last[none] = _previous(carried)[row[none], hi[none]]
    return last

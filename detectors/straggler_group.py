"""Groups of stragglers: ranks that turn slow together from one step on and stay slow.

A noisy host slows one rank, then another, for a moment each: scattered, uncorrelated
blips, which :mod:`detectors.straggler`'s steps 5 and 6 hold back. A group is one cause (a
slower node, switch or data shard) seen on several ranks at once: at least ``group_ranks``
ranks whose episodes are still going and began within ``group_steps`` steps of one another.
Its episodes are not held back as blips or as a noisy host's (:func:`mark_groups`), and a
rank that moved to the hold level at a group's onset and stayed there is one of it, even
if it does not cross the threshold itself (:func:`joiners`; two ranks that did and the
ranks that join them are a group too): a group 1.10x slower sits right at a 10% threshold,
and some of its ranks cross it late, or never.

    >>> import numpy as np
    >>> from detectors.straggler import StragglerConfig
    >>> from detectors.straggler_episodes import Episodes
    >>> on = np.array([50, 52, 55, 120])           # four ranks' episode onsets, all going
    >>> no = np.zeros(4, dtype=bool)
    >>> ep = Episodes(np.arange(4), on, on + 9, on + 4, np.full(4, 199), np.ones(4), no, no, no)
    >>> grouped(ep, 200, StragglerConfig()).tolist()
    [True, True, True, False]
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from detectors.robust import nanmedian_rows_counts
from detectors.straggler_episodes import (
    Block,
    Episodes,
    carry_forward,
    hold_needs,
    k_of_m,
    newest,
)

if TYPE_CHECKING:
    from detectors.straggler import StragglerConfig

F32Array = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

__all__ = ["grouped", "joiners", "mark_groups"]

MEDIAN_ERROR = 1.2533  # standard error of a median of n normal values, in sigma / sqrt(n)


def grouped(ep: Episodes, n_steps: int, cfg: StragglerConfig) -> BoolArray:
    """Which of the episodes ``ep`` (one per row) are one of a group: still going, with
    onsets within ``group_steps`` steps of those of ``group_ranks - 1`` others still going."""
    going = ep.end == n_steps - 1
    onsets = np.sort(ep.onset[going])
    lo = np.searchsorted(onsets, ep.onset - cfg.group_steps, side="left")
    hi = np.searchsorted(onsets, ep.onset + cfg.group_steps, side="right")
    out: BoolArray = going & (hi - lo >= cfg.group_ranks)
    return out


def mark_groups(ep: Episodes, n_steps: int, cfg: StragglerConfig) -> Episodes:
    """``ep`` (row by row, in step order) with ``group`` set on each row's most recent
    episode when it is one of a group (:func:`grouped`), and such an episode ``cheap`` only
    when the episodes still going with onsets within ``group_steps`` steps of its own cost
    under ``min_cost_s`` together: one cause, whose cost is the compute its ranks lost."""
    last = np.flatnonzero(newest(ep))
    members = last[grouped(ep.subset(last), n_steps, cfg)]
    group = np.zeros(ep.rows.size, dtype=bool)
    group[members] = True
    going = last[ep.end[last] == n_steps - 1]
    order = going[np.argsort(ep.onset[going], kind="stable")]
    onsets = ep.onset[order]
    total = np.concatenate(([0.0], np.cumsum(ep.cost[order])))
    lo = np.searchsorted(onsets, ep.onset[members] - cfg.group_steps, side="left")
    hi = np.searchsorted(onsets, ep.onset[members] + cfg.group_steps, side="right")
    cheap = ep.cheap.copy()
    cheap[members] = total[hi] - total[lo] < cfg.min_cost_s
    return replace(ep, group=group, cheap=cheap)


def joiners(
    ep: Episodes,
    block: Block,
    adj: F32Array,
    level: np.float32,
    scale: float,
    cfg: StragglerConfig,
) -> tuple[IntArray, IntArray]:
    """The columns of ``adj`` (the (S x R) corrected ratios) of ranks outside ``block`` that
    join a group forming among the episodes ``ep`` inside the window: at least
    ``group_ranks - 1`` episodes still going, with onsets within ``group_steps`` steps of
    one another (their median onset: t0), and with the ranks that join, ``group_ranks`` at
    least. A rank that joins:

    - is at the hold level ``level`` by the hysteresis rule from about t0 (the first of
      the ``persist_m`` steps before that rule held is within ``group_steps`` steps of t0,
      and after the window's first step) to the window's last step;
    - and its median corrected ratio since t0, over n observed steps, is at the hold level
      and ``join_z`` standard errors above its normal (``scale``, the ranks' typical spread
      at a step, over sqrt(n), times 1.25 for a median): a ratio that high for that long is
      not one rank's noise, even among 16,384; a median, so that one long pause at the
      onset (a garbage collection) does not make a rank one of the group.

    Returns those columns, and for each the step index from which it is one of the group
    (the first step of its run at the hold level)."""
    n_steps = adj.shape[0]
    m, need = cfg.persist_m, hold_needs(cfg)
    none = np.zeros(0, dtype=np.int64)
    last = np.flatnonzero(newest(ep))
    onsets = np.sort(ep.onset[last[(ep.end[last] == n_steps - 1) & (ep.onset[last] > 0)]])
    lo = np.searchsorted(onsets, onsets - cfg.group_steps, side="left")
    hi = np.searchsorted(onsets, onsets + cfg.group_steps, side="right")
    if not onsets.size or (hi - lo).max() < cfg.group_ranks - 1 or n_steps < m:
        return none, none
    densest = int(np.argmax(hi - lo))
    core = int(hi[densest] - lo[densest])
    t0 = int(np.median(onsets[lo[densest] : hi[densest]]))
    # Cheap first cut: at the hold level on enough of the last steps to hold there now.
    cand = np.flatnonzero((adj[-m:] >= level).sum(axis=0) >= need)
    cand = np.setdiff1d(cand, block.cols)
    if not cand.size:
        return none, none
    by_rank = np.ascontiguousarray(adj[:, cand].T).astype(np.float64)
    seen = np.isfinite(by_rank)
    kept = carry_forward(by_rank >= level, seen, axis=1)
    keep = k_of_m(kept, need, m)
    idx = np.arange(n_steps)
    begin = np.max(np.where(~keep, idx[None, :], -1), axis=1) + 1  # of the run to the end
    lead = np.clip(begin[:, None] - m + 1 + np.arange(m)[None, :], 0, n_steps - 1)
    rows = np.arange(cand.size)[:, None]
    first = lead[rows[:, 0], kept[rows, lead].argmax(axis=1)]
    median, n = nanmedian_rows_counts(np.ascontiguousarray(by_rank[:, t0:]))
    error = MEDIAN_ERROR * scale / np.sqrt(np.maximum(n, 1))  # of the median of n steps
    high = median >= np.maximum(float(level), 1.0 + cfg.join_z * error)
    near = np.abs(first - t0) <= cfg.group_steps
    ok = (begin < n_steps) & (first > 0) & near & high
    if core + int(ok.sum()) < cfg.group_ranks:
        return none, none
    return cand[ok], first[ok]

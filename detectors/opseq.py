"""Operator-sequence drift: a shape fingerprint never seen before becomes a rank's steady state.

    findings = detect_opseq_change(window.opseq)   # an OpSeqWindow (detectors.window)

Every step record carries ``shape_fp``, a cheap fingerprint of the modules the step ran and
their tensor shapes (``collector/integrations/shape_fp.py``). A sequence-length curriculum,
a new phase of training or another model on the same ranks changes it; the activation-swap
policy made for the old op sequence no longer fits, so Vigil regenerates one
(``backend.swap``), reading this finding's evidence.

Rule, per rank, on the window's steps (a step the rank did not report counts as running
what it ran before; after its last report the rank has no value). Per rank, not by a
majority of ranks: pipeline stages run different sequences, so no fingerprint need be what
most ranks run; in a data-parallel job every rank changes at once and the finding names
no rank.

1. **Steady.** The rank's last ``steady_steps`` (default 5) reported steps all ran one
   fingerprint ``F``: a one-off step (an odd last batch) is never a change.
2. **New.** ``F`` was first seen in the job (``first_step``, over every rank and attempt)
   inside the window and within the last ``fresh_steps`` (default 200) steps, and later
   than the job's very first fingerprint (the job's first steps are no change).
3. **First time steady.** Since ``F`` was first steady on the rank, no other fingerprint
   was: a job that alternates between sequence-length buckets (A, B, A, B, …) gets one
   finding for B, while B first holds, and none when it comes back to B or to A.

All ranks that changed to ``F`` share one finding (kind ``opseq_change``, key
``opseq_change:<F>``, severity ``info``; ``ranks`` empty when every rank of the window
changed). Its ``first_step`` is the first step of the change: where the rank first ran ``F``
after the last other steady fingerprint (the earliest over the ranks), so with a
fingerprint on every step it is ``steady_steps`` behind the detection at most. It stays
active while ``F`` is the steady state and was first seen within ``fresh_steps``: it
resolves on its own when the job moves on, or ``fresh_steps`` after the change.

Evidence (``backend.swap`` reads these keys): ``from_shape_fp`` (what most of those ranks
ran before; None if the window does not show it), ``to_shape_fp`` (``F``), ``from_opseq``
and ``to_opseq`` (the op-sequence hashes behind them, None until a captured step covered
them), ``change``: ``"structure"`` (the op names differ: ``opseqs.structure``),
``"shapes"`` (same op names, new shapes) or ``"unknown"`` (a sequence not captured yet),
``steady_steps`` and ``ranks_changed`` (how many ranks).

Cost: in a steady state (no fingerprint first seen within ``fresh_steps``) a look at each
fingerprint, microseconds. For ``fresh_steps`` after a change, a few vectorised passes over
the rank × step codes from the change on: 16,384 ranks × 200 steps took 20 ms of CPU just
after a change and 100-140 ms 200 steps after it (a loaded 2-core machine).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from detectors.finding import Finding
from detectors.registry import register
from detectors.window import IntArray, OpSeqWindow, Window

__all__ = ["OpSeqConfig", "detect_opseq_change"]

BoolGrid = np.ndarray[Any, np.dtype[np.bool_]]


@dataclass(frozen=True)
class OpSeqConfig:
    """Tuning for :func:`detect_opseq_change`."""

    steady_steps: int = 5
    """A fingerprint is a rank's steady state when its last this-many steps ran it."""
    fresh_steps: int = 200
    """A fingerprint first seen longer ago than this is no change (the finding resolves)."""


def detect_opseq_change(window: OpSeqWindow, config: OpSeqConfig | None = None) -> list[Finding]:
    """One finding per new fingerprint that became some ranks' steady state (module doc).

    >>> from detectors.window import ShapeInfo
    >>> grid = [["a"] * 10 + ["b"] * 6]  # one rank: a for ten steps, then b
    >>> w = OpSeqWindow.from_grid(steps=range(16), ranks=[0], shape_fp=grid,
    ...     known={"a": ShapeInfo(0), "b": ShapeInfo(10)})
    >>> [(f.key, f.first_step, f.evidence["from_shape_fp"]) for f in detect_opseq_change(w)]
    [('opseq_change:b', 10, 'a')]
    """
    cfg = config or OpSeqConfig()
    k = max(1, cfg.steady_steps)
    n_ranks, n_steps = window.codes.shape
    if n_ranks == 0 or n_steps == 0 or not window.fingerprints:
        return []
    fresh = _fresh(window, cfg)
    if not fresh.any():
        return []  # the usual case, at the cost of a look at each fingerprint
    rows, last = _latest_new(window.codes, fresh)
    if rows.size == 0:
        return []
    # Columns before the earliest new fingerprint's first step (less k, to see a steady run
    # that ends there) cannot change the outcome: right after a change the work is small.
    first_new = min(window.known[fp].first_step for fp in np.array(window.fingerprints)[fresh])
    start = max(0, int(np.searchsorted(window.steps, first_new)) - k)
    last = last - start
    filled = _forward_fill(window.codes[rows, start:], last)
    steady_end = _steady_ends(filled, k)
    steady = steady_end[np.arange(rows.size), last]
    rows, filled, steady_end, last = rows[steady], filled[steady], steady_end[steady], last[steady]
    now = filled[np.arange(rows.size), last]
    onset, since = _first_steady_episode(filled, steady_end, now)
    ok = onset >= 0
    rows, now, onset, since = rows[ok], now[ok], onset[ok] + start, since[ok]
    return [
        _finding(window, k, int(code), rows[now == code], onset[now == code], since[now == code])
        for code in np.unique(now)
    ]


def _latest_new(codes: IntArray, fresh: BoolGrid) -> tuple[IntArray, IntArray]:
    """The ranks (row indexes) whose latest report is a new fingerprint, and the column of
    that report."""
    reported = codes >= 0
    last = codes.shape[1] - 1 - np.argmax(reported[:, ::-1], axis=1)
    rows = np.flatnonzero(reported.any(axis=1))
    rows = rows[fresh[codes[rows, last[rows]]]]
    return rows, last[rows]


def _forward_fill(codes: IntArray, last: IntArray) -> IntArray:
    """Codes with each gap filled by the value before it, except after a rank's last
    reported column ``last`` (left -1)."""
    if (codes >= 0).all():
        return codes  # no gaps (the usual case)
    cols = np.arange(codes.shape[1])
    source = np.maximum.accumulate(np.where(codes >= 0, cols, -1), axis=1)
    filled = np.take_along_axis(codes, np.maximum(source, 0), axis=1)
    filled[(source < 0) | (cols[None, :] > last[:, None])] = -1
    return filled


def _steady_ends(filled: IntArray, k: int) -> BoolGrid:
    """``[r, s]``: the rank's fingerprint at column ``s`` has held for ``k`` columns."""
    n_steps = filled.shape[1]
    cols = np.arange(n_steps)
    breaks = np.ones(filled.shape, dtype=bool)
    breaks[:, 1:] = filled[:, 1:] != filled[:, :-1]
    run_start = np.maximum.accumulate(np.where(breaks, cols, 0), axis=1)
    return np.asarray((cols - run_start + 1 >= k) & (filled >= 0))


def _fresh(window: OpSeqWindow, cfg: OpSeqConfig) -> BoolGrid:
    """Per fingerprint code: first seen in the window, within ``fresh_steps`` of its last
    step, and after the job's first fingerprint. One first seen *after* the window (an
    earlier run of the job got further) is no news either."""
    since = int(max(window.steps[0], window.steps[-1] - cfg.fresh_steps + 1))
    until = int(window.steps[-1])
    first_ever = window.job_first_step
    out = np.zeros(len(window.fingerprints), dtype=bool)
    for code, fp in enumerate(window.fingerprints):
        info = window.known.get(fp)
        out[code] = (
            info is not None
            and since <= info.first_step <= until
            and (first_ever is None or info.first_step > first_ever)
        )
    return out


def _first_steady_episode(
    filled: IntArray, steady_end: BoolGrid, now: IntArray
) -> tuple[IntArray, IntArray]:
    """Per rank (rows of ``filled``) that is steady on ``now``: the column where that
    episode began (the first ``now`` after the last other steady fingerprint), or -1 when
    ``now`` had been steady before another fingerprint was; and the code before it (-1:
    not in the window)."""
    n_rows, n_steps = filled.shape
    cols = np.broadcast_to(np.arange(n_steps), filled.shape)
    is_now = filled == now[:, None]
    other = steady_end & ~is_now
    last_other = np.where(other.any(axis=1), np.where(other, cols, -1).max(axis=1), -1)
    first_steady = np.where(steady_end & is_now, cols, n_steps).min(axis=1)
    after = is_now & (cols > last_other[:, None])
    onset = np.where(after.any(axis=1), np.argmax(after, axis=1), -1)
    onset[first_steady < last_other] = -1  # it came back to a fingerprint it already held
    before = np.where(onset > 0, filled[np.arange(n_rows), np.maximum(onset - 1, 0)], -1)
    return onset.astype(np.int64), before.astype(np.int64)


def _finding(
    window: OpSeqWindow,
    k: int,
    code: int,
    rows: IntArray,
    onset: IntArray,
    before: IntArray,
) -> Finding:
    to_fp = window.fingerprints[code]
    prior = Counter(int(c) for c in before if c >= 0).most_common(1)
    from_fp = window.fingerprints[prior[0][0]] if prior else None
    to_info = window.known[to_fp]
    from_info = window.known.get(from_fp) if from_fp is not None else None
    change = _change(from_info.structure if from_info else None, to_info.structure)
    n_ranks = window.codes.shape[0]
    every = rows.size == n_ranks
    first_step = int(window.steps[int(onset.min())])
    what = {
        "structure": "new op structure",
        "shapes": "same ops, new shapes",
        "unknown": "op sequence not captured yet",
    }[change]
    who = "every rank" if every else _rank_list(window.ranks[rows])
    return Finding(
        kind="opseq_change",
        severity="info",
        ranks=() if every else tuple(int(r) for r in window.ranks[rows]),
        first_step=first_step,
        score=round(rows.size / n_ranks, 3),
        summary=(
            f"op sequence changed at step {first_step}: new shape fingerprint {to_fp[:12]} "
            f"({what}) on {who}, steady for {k}+ steps"
        ),
        key=f"opseq_change:{to_fp}",
        evidence={
            "from_shape_fp": from_fp,
            "to_shape_fp": to_fp,
            "from_opseq": from_info.opseq if from_info else None,
            "to_opseq": to_info.opseq,
            "change": change,
            "steady_steps": k,
            "ranks_changed": int(rows.size),
        },
        active=True,
        last_step=int(window.steps[-1]),
    )


def _change(before: str | None, after: str | None) -> str:
    if before is None or after is None:
        return "unknown"
    return "shapes" if before == after else "structure"


def _rank_list(ranks: IntArray, shown: int = 8) -> str:
    names = ", ".join(str(int(r)) for r in ranks[:shown])
    more = f" and {ranks.size - shown} more" if ranks.size > shown else ""
    return f"rank{'s' if ranks.size > 1 else ''} {names}{more}"


@register("opseq", kinds={"opseq_change"}, needs={"opseq"})
def _detect_window(window: Window) -> list[Finding]:
    assert window.opseq is not None
    return detect_opseq_change(window.opseq)

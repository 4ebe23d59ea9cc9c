"""Goodput (ETTR) accounting: where a training job's wall-clock time went.

    attempts = [
        Attempt(attempt=0, steps=range(81), ends=[...], durations=[1.0] * 81),
        Attempt(attempt=1, steps=range(51, 100), ends=[...], durations=[1.0] * 49),
    ]
    g = account(attempts, end=1192.0, checkpoints=[CheckpointSave(ts=1053.0, step=50)])
    g.total_s, g.goodput, g.badput["wasted_progress"], g.steps_lost, g.restarts
    # -> 192.0, 0.52, 30.0, 30, 1

Like Google's ml-goodput-measurement: productive time against time lost, by cause. The job
is accounted on one step timeline (in synchronous training every rank has the same one);
``Attempt.ends`` are wall-clock times at the *end* of each step, as the collector sends them.

**The window** runs from the start of the first step (its end minus its duration) to ``end``
(the caller's "now" or the job's last activity; never before the last step's end). It is cut
into contiguous segments, so every second lands in exactly one category:

- a *slot* per step: from the previous step's end in the same attempt to this step's end
  (the first step of an attempt: its own start, ``end - duration``). A slot holds the step's
  window (``duration_s``) and the gap before it (data fetch outside the step, checkpoint
  saves, logging, evaluation).
- a *tail* per attempt: from its last step's end to the next attempt's first step start (the
  window end for the last attempt).

Timestamps that run backwards (clock skew between attempts) are clamped, so no segment is
negative. Categories, in the order each takes its share of a segment:

``hang``
    A hang interval (from a hang incident) claims, in the segment that contains its start,
    the time from that segment's start (the last progress) to the hang's end, capped at the
    segment's end and, in a tail, at the attempt's ``last_activity`` when known. In a slot
    (the job hung and then went on) it claims at most the slot's excess over the job's
    median slot, so the step's normal work is not counted as hung.
``checkpointing``
    Each save is placed in the segment containing its ``ts`` (without ``ts``: the segment
    right after the last execution of its ``step``). It takes ``duration_s`` when known,
    else the slot's gap (a tail without a duration gets nothing); first out of the gap,
    then out of the step window. Counted in wasted slots too: a save is overhead, not lost
    progress.
``wasted_progress``
    The rest of every slot whose step was redone: a step ``n`` run in attempt ``a`` is lost
    when a later attempt's first (lowest) step is ``<= n``, i.e. the job rolled back past it.
``data_loading``
    In surviving slots, ``data_s`` (the time the step waited for input), placed first in
    what is left of the gap and the rest inside the step window.
``straggler_slowdown``
    For surviving slots that end inside a straggler interval (and within its step range
    when given): the step's compute time (its window less hang, checkpoint and data time)
    beyond the baseline, never more than the compute time. The baseline is the interval's
    ``baseline_s``, else the median compute time of the ``baseline_steps`` slots that ended
    before the interval starts (none before it: no slowdown is counted). Overlapping
    intervals count a slot once.
``productive``
    The rest of the step window of surviving slots: compute whose progress survived.
``disruption_recovery``
    The tails of every attempt but the last, less hang and known checkpoint time: from the
    last step of an attempt (crash, eviction, restart, checkpoint load) to the next
    attempt's first step.
``other``
    The remainder: gaps between steps not explained above, and the last attempt's tail
    (the step in progress) when it is not a hang. ``other = total − Σ(the rest)``, so the
    categories sum to ``total_s`` exactly (up to float rounding, clamped at 0).

``goodput = productive / total`` (``None`` for an empty window). ``restarts`` is the last
attempt number minus the first; ``steps_lost`` counts the redone step executions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

CATEGORIES = (
    "productive",
    "wasted_progress",
    "disruption_recovery",
    "hang",
    "straggler_slowdown",
    "data_loading",
    "checkpointing",
    "other",
)
BADPUT = CATEGORIES[1:]

F64 = NDArray[np.float64]


@dataclass(frozen=True)
class Attempt:
    """One launcher attempt's steps (``attempt`` = torchrun's restart count).

    ``ends`` are wall-clock step ends; ``data_s`` may be ``None`` (no data waits known);
    ``last_activity`` is the attempt's last sign of life (heartbeat), when known.
    """

    attempt: int
    steps: npt.ArrayLike
    ends: npt.ArrayLike
    durations: npt.ArrayLike
    data_s: npt.ArrayLike | None = None
    last_activity: float | None = None


@dataclass(frozen=True)
class CheckpointSave:
    """A finished save: ``ts`` when it was reported, ``step`` it saved, ``duration_s``."""

    ts: float | None = None
    step: int | None = None
    duration_s: float | None = None


@dataclass(frozen=True)
class Hang:
    """A hang incident: detected at ``start``, over at ``end`` (``None``: still hung)."""

    start: float
    end: float | None = None


@dataclass(frozen=True)
class Straggler:
    """A straggler episode: slots ending in ``(start, end]`` and steps in
    ``[first_step, last_step]`` (each bound optional) are slowed down."""

    start: float
    end: float | None = None
    first_step: int | None = None
    last_step: int | None = None
    baseline_s: float | None = None


@dataclass(frozen=True)
class Goodput:
    start: float
    end: float
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    restarts: int = 0
    steps_lost: int = 0
    steps_productive: int = 0

    @property
    def total_s(self) -> float:
        return self.end - self.start

    @property
    def productive_s(self) -> float:
        return self.seconds["productive"]

    @property
    def goodput(self) -> float | None:
        return self.productive_s / self.total_s if self.total_s > 0 else None

    @property
    def badput(self) -> dict[str, float]:
        return {k: self.seconds[k] for k in BADPUT}


@dataclass
class _Timeline:
    att: NDArray[np.intp]  # index into the sorted attempts
    step: NDArray[np.int64]
    start: F64
    end: F64
    dur: F64
    data: F64
    seg: NDArray[np.intp]  # segment index of each slot
    tail_seg: NDArray[np.intp]  # segment index of each attempt's tail
    seg_start: F64
    seg_end: F64


def account(
    attempts: Iterable[Attempt],
    *,
    end: float,
    checkpoints: Iterable[CheckpointSave] = (),
    hangs: Iterable[Hang] = (),
    stragglers: Iterable[Straggler] = (),
    baseline_steps: int = 100,
) -> Goodput:
    """Account the window from the first step's start to ``end`` (see the module doc)."""
    runs = sorted((a for a in attempts if np.asarray(a.ends).size), key=lambda a: a.attempt)
    if not runs:
        return Goodput(start=end, end=end)
    tl = _timeline(runs, end)
    window_end = float(tl.seg_end[-1])
    window_start = float(tl.start[0])
    seg_len = tl.seg_end - tl.seg_start
    slot_len = tl.end - tl.start

    # Which step executions survived: those below every later attempt's resume step.
    resume = np.array([float(np.asarray(a.steps).min()) for a in runs])
    cut = np.append(np.minimum.accumulate(resume[::-1])[::-1][1:], np.inf)
    survive = tl.step < cut[tl.att]

    hang = _hangs(tl, runs, hangs, float(np.median(slot_len)))
    req, use_gap = _checkpoints(tl, checkpoints, window_start, window_end)

    # Slots: hang first (out of the step window), then checkpointing, then the rest.
    h = hang[tl.seg]
    d = np.minimum(tl.dur, slot_len)
    d1 = np.maximum(d - h, 0.0)
    g1 = np.maximum(slot_len - h - d1, 0.0)
    c = np.where(use_gap[tl.seg], np.maximum(req[tl.seg], g1), req[tl.seg])
    c_gap = np.minimum(c, g1)
    c_win = np.minimum(c - c_gap, d1)
    g2, d2 = g1 - c_gap, d1 - c_win
    data_gap = np.minimum(tl.data, g2)
    data_win = np.minimum(tl.data - data_gap, d2)
    compute = d2 - data_win
    slow = _slowdown(tl, compute, stragglers, baseline_steps)

    s = survive
    out = dict.fromkeys(CATEGORIES, 0.0)
    out["hang"] = float(h.sum())
    out["checkpointing"] = float((c_gap + c_win).sum())
    out["wasted_progress"] = float(np.maximum(slot_len - h - c_gap - c_win, 0.0)[~s].sum())
    out["data_loading"] = float((data_gap + data_win)[s].sum())
    out["straggler_slowdown"] = float(slow[s].sum())
    out["productive"] = float((compute - slow)[s].sum())

    # Tails: hang, then a checkpoint of known duration, then downtime (or "other" at the end).
    t = tl.tail_seg
    t_len = seg_len[t]
    t_hang = np.minimum(hang[t], t_len)
    t_ckpt = np.minimum(req[t], t_len - t_hang)
    out["hang"] += float(t_hang.sum())
    out["checkpointing"] += float(t_ckpt.sum())
    out["disruption_recovery"] = float((t_len - t_hang - t_ckpt)[:-1].sum())

    total = window_end - window_start
    out["other"] = max(0.0, total - sum(v for k, v in out.items() if k != "other"))
    return Goodput(
        start=window_start,
        end=window_end,
        seconds=out,
        restarts=runs[-1].attempt - runs[0].attempt,
        steps_lost=int((~s).sum()),
        steps_productive=int(s.sum()),
    )


def _timeline(runs: Sequence[Attempt], end: float) -> _Timeline:
    atts, steps, ends, durs, datas = [], [], [], [], []
    for k, a in enumerate(runs):
        e = np.asarray(a.ends, dtype=np.float64).reshape(-1)
        st = np.asarray(a.steps, dtype=np.int64).reshape(-1)
        du = np.asarray(a.durations, dtype=np.float64).reshape(-1)
        da = (
            np.zeros_like(e)
            if a.data_s is None
            else np.asarray(a.data_s, dtype=np.float64).reshape(-1)
        )
        if not (st.size == e.size == du.size == da.size):
            raise ValueError(f"attempt {a.attempt}: steps, ends, durations, data_s differ in size")
        order = np.lexsort((st, e))
        atts.append(np.full(e.size, k, dtype=np.intp))
        steps.append(st[order])
        ends.append(e[order])
        durs.append(np.clip(np.nan_to_num(du[order]), 0.0, None))
        datas.append(np.clip(np.nan_to_num(da[order]), 0.0, None))
    att = np.concatenate(atts)
    e_raw = np.concatenate(ends)
    dur = np.concatenate(durs)
    first = np.ones(att.size, dtype=bool)
    first[1:] = att[1:] != att[:-1]

    e = np.maximum.accumulate(e_raw)  # clamped: ends never run backwards
    prev = np.empty_like(e)
    prev[0] = e_raw[0] - dur[0]
    prev[1:] = e[:-1]
    start = np.where(first, np.maximum(e_raw - dur, prev), prev)
    start = np.minimum(start, e)

    # Segments: each attempt's slots, then its tail.
    n_att = len(runs)
    seg = np.arange(att.size, dtype=np.intp) + att
    last = np.append(np.flatnonzero(first)[1:], att.size) - 1
    tail_seg = last + np.arange(n_att, dtype=np.intp) + 1
    seg_start = np.empty(att.size + n_att)
    seg_end = np.empty(att.size + n_att)
    seg_start[seg], seg_end[seg] = start, e
    next_start = np.append(start[first][1:], max(end, float(e[-1])))
    seg_start[tail_seg] = e[last]
    seg_end[tail_seg] = np.maximum(next_start, e[last])
    return _Timeline(
        att=att,
        step=np.concatenate(steps),
        start=start,
        end=e,
        dur=dur,
        data=np.concatenate(datas),
        seg=seg,
        tail_seg=tail_seg,
        seg_start=seg_start,
        seg_end=seg_end,
    )


def _locate(tl: _Timeline, ts: float) -> int:
    return min(int(np.searchsorted(tl.seg_end, ts, side="left")), tl.seg_end.size - 1)


def _hangs(tl: _Timeline, runs: Sequence[Attempt], hangs: Iterable[Hang], typical: float) -> F64:
    out = np.zeros(tl.seg_end.size)
    is_tail = np.zeros(tl.seg_end.size, dtype=bool)
    is_tail[tl.tail_seg] = True
    tail_attempt = dict(zip(tl.tail_seg.tolist(), runs, strict=True))
    for hg in hangs:
        if not tl.seg_start[0] <= hg.start <= tl.seg_end[-1]:
            continue
        j = _locate(tl, hg.start)
        stop = min(hg.end if hg.end is not None else np.inf, tl.seg_end[j])
        if is_tail[j]:
            activity = tail_attempt[j].last_activity
            if activity is not None:
                stop = min(stop, max(activity, tl.seg_start[j]))
            amount = max(0.0, stop - tl.seg_start[j])
        else:
            length = tl.seg_end[j] - tl.seg_start[j]
            amount = min(max(0.0, stop - tl.seg_start[j]), max(0.0, length - typical))
        out[j] = max(out[j], amount)
    return out


def _checkpoints(
    tl: _Timeline, saves: Iterable[CheckpointSave], lo: float, hi: float
) -> tuple[F64, NDArray[np.bool_]]:
    req = np.zeros(tl.seg_end.size)
    use_gap = np.zeros(tl.seg_end.size, dtype=bool)
    for cp in saves:
        if cp.ts is not None:
            if not lo <= cp.ts <= hi:
                continue
            j = _locate(tl, cp.ts)
        elif cp.step is not None:
            hits = np.flatnonzero(tl.step == cp.step)
            if not hits.size:
                continue
            j = int(tl.seg[hits[-1]]) + 1  # the segment after that step ended
        else:
            continue
        if cp.duration_s is not None and np.isfinite(cp.duration_s):
            req[j] += max(0.0, cp.duration_s)
        else:
            use_gap[j] = True
    return req, use_gap


def _slowdown(
    tl: _Timeline, compute: F64, stragglers: Iterable[Straggler], baseline_steps: int
) -> F64:
    out = np.zeros(compute.size)
    for sg in stragglers:
        inside = (tl.end > sg.start) & (tl.end <= (sg.end if sg.end is not None else np.inf))
        if sg.first_step is not None:
            inside &= tl.step >= sg.first_step
        if sg.last_step is not None:
            inside &= tl.step <= sg.last_step
        base = sg.baseline_s
        if base is None:
            before = compute[tl.end <= sg.start][-max(1, baseline_steps) :]
            if not before.size:
                continue
            base = float(np.median(before))
        excess = np.clip(compute - base, 0.0, compute)
        out = np.maximum(out, np.where(inside, excess, 0.0))
    return out


def as_dict(g: Goodput) -> dict[str, Any]:
    """A JSON-friendly view: ``total_s``, ``productive_s``, ``goodput``, ``badput``, counts."""
    return {
        "start": g.start,
        "end": g.end,
        "total_s": g.total_s,
        "productive_s": g.productive_s,
        "goodput": g.goodput,
        "badput": g.badput,
        "restarts": g.restarts,
        "steps_lost": g.steps_lost,
        "steps_productive": g.steps_productive,
    }

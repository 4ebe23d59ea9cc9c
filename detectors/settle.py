"""Which steps of a window are settled enough to judge, when ranks report out of step.

Collectors flush every second or so; batches from thousands of ranks reach the server in
any order (a whole rank's backlog at once after a network blip, round-robin, a retried
batch after a later one), and a detection run often sees the newest steps of only some
ranks. Cross-rank statistics over such a partial tail compare a rank with whichever ranks
happen to have arrived: a never-slow rank is named, others are named again and again.

The rule: a step is judged once at least ``min_fraction`` of the job's *live* ranks (those
that have sent a heartbeat within ``live_s`` of the job's newest one: a rank that crashed
or left stops counting) have reported it — every live rank in a job of fewer than
``ALL_BELOW`` ranks, where one missing rank is a tenth of the sample and moves the
reference (PAI job_1's 10 workers re-opened a straggler that way), while in a big job some
rank's batch is nearly always late and waiting for all would stall detection. The window
is cut before the first step of its newest ``max_hold`` steps that is not there yet; those
steps wait for the next run, which sees them complete, as an in-order replay would. Steps
older than that are judged as they are, so a batch that never comes (set aside by its
collector) holds detection back by at most ``max_hold`` steps.

    >>> import numpy as np
    >>> from detectors.window import StepWindow
    >>> t = np.ones((4, 6)); t[2:, 4:] = np.nan           # ranks 2 and 3 not in yet for 4, 5
    >>> w = StepWindow.from_arrays(steps=range(6), ranks=range(4), step_time=t)
    >>> settled(w, live_ranks=4).steps.tolist()
    [0, 1, 2, 3]
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from detectors.window import StepWindow

MIN_FRACTION = 0.9
ALL_BELOW = 20  # ranks: smaller jobs wait for every live rank
MAX_HOLD = 64  # steps

__all__ = ["ALL_BELOW", "MAX_HOLD", "MIN_FRACTION", "settled"]


def settled(
    window: StepWindow,
    *,
    live_ranks: int,
    min_fraction: float = MIN_FRACTION,
    max_hold: int = MAX_HOLD,
) -> StepWindow:
    """``window`` without its unsettled tail (see the module docstring); the same object
    when nothing is held back."""
    if not 0.0 < min_fraction <= 1.0 or max_hold < 0:
        raise ValueError("need 0 < min_fraction <= 1 and max_hold >= 0")
    n_steps = window.steps.size
    if n_steps == 0 or live_ranks <= 0 or max_hold == 0:
        return window
    need = live_ranks if live_ranks < ALL_BELOW else math.ceil(min_fraction * live_ranks)
    reported = np.isfinite(window.step_time).sum(axis=0)  # (S,) ranks per step
    tail = reported[-max_hold:]
    short = np.flatnonzero(tail < need)
    if not short.size:
        return window
    keep = n_steps - tail.size + int(short[0])
    return _head(window, keep)


def _head(window: StepWindow, keep: int) -> StepWindow:
    """The window's first ``keep`` steps (every rank × step array cut alike)."""
    cut = {
        f.name: getattr(window, f.name)[:, :keep]
        for f in dataclasses.fields(window)
        if isinstance(getattr(window, f.name), np.ndarray) and getattr(window, f.name).ndim == 2
    }
    return dataclasses.replace(window, steps=window.steps[:keep], **cut)

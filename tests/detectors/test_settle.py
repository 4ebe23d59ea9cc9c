"""``detectors.settle.settled``: which steps of a window are complete enough to judge."""

from __future__ import annotations

import numpy as np
import pytest

from detectors.settle import ALL_BELOW, MAX_HOLD, settled
from detectors.window import StepWindow


def _window(ranks: int, steps: int, missing: dict[int, int]) -> StepWindow:
    """``missing``: step index → how many ranks have not reported it yet."""
    t = np.ones((ranks, steps))
    for step, n in missing.items():
        t[:n, step] = np.nan
    return StepWindow.from_arrays(steps=range(steps), ranks=range(ranks), step_time=t)


def test_a_small_job_waits_for_every_live_rank() -> None:
    w = _window(10, 30, {28: 1, 29: 1})  # one of ten ranks not in yet for the last two
    assert settled(w, live_ranks=10).steps[-1] == 27


def test_a_big_job_judges_a_step_nine_tenths_of_its_ranks_reported() -> None:
    assert ALL_BELOW <= 40
    w = _window(40, 30, {27: 5, 28: 4, 29: 4})  # 35 of 40, then 36 of 40
    out = settled(w, live_ranks=40)
    assert out.steps[-1] == 26  # 35 < ceil(0.9 * 40) = 36: waits from step 27 on
    assert out.step_time.shape == (40, 27) and out.comm_time.shape == (40, 27)


def test_ranks_that_left_are_not_waited_for() -> None:
    w = _window(10, 30, {29: 2})
    assert settled(w, live_ranks=8).steps[-1] == 29


def test_only_the_newest_steps_are_held_back() -> None:
    steps = MAX_HOLD + 40
    w = _window(10, steps, {5: 3})  # an old hole: that batch may never come
    assert settled(w, live_ranks=10) is w


def test_nothing_settled_is_an_empty_window() -> None:
    w = _window(10, 5, {0: 1})
    assert settled(w, live_ranks=10).steps.size == 0


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="min_fraction"):
        settled(_window(4, 3, {}), live_ranks=4, min_fraction=0.0)

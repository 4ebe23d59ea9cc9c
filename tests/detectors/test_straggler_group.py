"""A group of ranks that slows down together is named, rank by rank, for as long as it
lasts; ranks that are slower from the first step are not (issue 15, item 1).

Replays are sliding 200-step windows every 10 steps, as the backend runs them, with each
rank's normal ratio learned once (``learn_baselines``) and passed back, as the runner does.
"""

from __future__ import annotations

import numpy as np
import pytest

from detectors.straggler import detect_stragglers, learn_baselines

RANKS, STEPS, ONSET = 16, 1500, 500
WIDTH, EVERY = 200, 10


def _job(slow: list[int], factor: float, *, seed: int = 0, always_slow=(0, 2)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    times = rng.normal(1.0, 0.02, (RANKS, STEPS))
    times[list(always_slow)] *= 1.08  # heterogeneous hardware from the first step
    times[slow, ONSET:] *= factor
    return times


def _replay(times: np.ndarray) -> dict[int, list[tuple[int, int]]]:
    """rank → (window end, finding first_step) for every window where it was named active."""
    base = np.full(RANKS, np.nan)
    named: dict[int, list[tuple[int, int]]] = {}
    for end in range(50, STEPS + 1, EVERY):
        lo = max(0, end - WIDTH)
        steps, window = np.arange(lo, end), times[:, lo:end]
        for f in detect_stragglers(steps, window, baseline=base):
            if f.active:
                named.setdefault(f.ranks[0], []).append((end, f.first_step))
        learned = learn_baselines(steps, window)
        todo = ~np.isfinite(base)
        base[todo] = learned[todo]
    return named


@pytest.mark.parametrize(
    ("slow", "factor"),
    [([1, 4, 6, 9, 11, 13], 1.2), ([3, 5, 7, 8, 10, 12, 14], 1.25), ([1, 6, 9, 13], 1.3)],
    ids=["6-of-16-at-1.2x", "7-of-16-at-1.25x", "4-of-16-at-1.3x"],
)
def test_a_slow_group_is_named_for_as_long_as_it_lasts(slow: list[int], factor: float) -> None:
    named = _replay(_job(slow, factor))
    assert sorted(named) == slow
    windows_after = len(range(ONSET + 20, STEPS + 1, EVERY))
    for rank in slow:
        onsets = [first for _, first in named[rank]]
        assert ONSET <= min(onsets) <= ONSET + 10, (rank, min(onsets))
        # Named in nearly every window from shortly after the onset to the end: the
        # window sliding past the onset must not absorb the slowdown into the baseline.
        late = [end for end, _ in named[rank] if end >= ONSET + 20]
        assert len(late) >= 0.9 * windows_after, (rank, len(late), windows_after)
        assert named[rank][-1][0] == STEPS


def test_ranks_slower_from_the_first_step_are_not_stragglers() -> None:
    named = _replay(_job([], 1.0, always_slow=(0, 2, 5)))
    assert named == {}


def test_baselines_are_learned_only_from_a_window_long_enough() -> None:
    times = _job([], 1.0)
    assert np.isnan(learn_baselines(np.arange(10), times[:, :10])).all()
    base = learn_baselines(np.arange(200), times[:, :200])
    assert base[0] == pytest.approx(1.08, abs=0.03)  # hardware that is always slower
    assert base[7] == pytest.approx(1.0, abs=0.03)
    assert (base >= 1.0).all()

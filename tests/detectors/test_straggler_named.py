"""What the straggler detector is told it named before, and groups (issue 15, item 1).

Each detection run judges its window afresh. A rank slower by about the threshold (a group
1.10x slower against a 10% threshold) would have to cross it again in every window, and the
noisy-host rule (step 6) and the short-blip rule (step 5) would hide, then show, a rank
already reported. So the caller passes ``named_since`` (its open incidents' first steps):
such a rank stays named while it stays at the hold level, and is not held back again. And
ranks that turn slow together from one step on are a group, not a noisy host.
"""

from __future__ import annotations

import numpy as np
import pytest

from detectors.straggler import StragglerConfig, detect_stragglers, learn_baselines

RANKS = 16
QUIET_HOST = StragglerConfig(noisy_min_s=0.0)  # no noisy-host rule: what it holds back


def _job(
    slow: dict[int, tuple[float, int, int]], *, step_s: float = 0.5, noise: float = 0.003
) -> tuple[np.ndarray, np.ndarray]:
    """200 steps (ids 300..499) of ``RANKS`` ranks; ``slow``: rank -> (factor, from column,
    to column)."""
    rng = np.random.default_rng(0)
    times = step_s * (1.0 + noise * rng.standard_normal((RANKS, 200)))
    for rank, (factor, lo, hi) in slow.items():
        times[rank, lo:hi] *= factor
    return np.arange(300, 500), times


def _since(**named: int) -> np.ndarray:
    since = np.full(RANKS, np.nan)
    for rank, step in named.items():
        since[int(rank.lstrip("r"))] = step
    return since


def test_a_named_rank_stays_named_while_it_stays_at_the_hold_level() -> None:
    # Rank 3 has been 1.08x slower since step 120, long before this window: under the 10%
    # threshold, over the hold level (5%). Judged afresh it is not named; named, it stays.
    steps, times = _job({3: (1.08, 0, 200)})
    base = np.ones(RANKS)  # the normals the caller learned before the slowdown
    assert detect_stragglers(steps, times, baseline=base) == []
    [f] = detect_stragglers(steps, times, baseline=base, named_since=_since(r3=120))
    assert f.ranks == (3,) and f.active
    assert f.first_step == 120  # the episode it was named for goes on
    assert f.evidence["steps_over_threshold"] == 0
    assert f.evidence["ratio_on_slow_steps"] == f.evidence["ratio"]  # no NaN in evidence


def test_a_named_rank_that_recovers_is_released() -> None:
    steps, times = _job({3: (1.08, 0, 120)})  # back to normal from step 420
    base = np.ones(RANKS)
    [f] = detect_stragglers(steps, times, baseline=base, named_since=_since(r3=120))
    assert f.ranks == (3,) and not f.active
    assert (f.first_step, f.last_step) == (120, 419)
    # A named rank that is under the hold level all along: nothing to report.
    steps, times = _job({})
    assert detect_stragglers(steps, times, baseline=base, named_since=_since(r3=120)) == []


def test_a_named_rank_is_not_held_back_as_a_noisy_hosts() -> None:
    # Rank 2 turned 1.3x slower at step 485 and was reported; rank 9 starts an episode at
    # step 490. Two ranks with episodes: the noisy-host rule wants 10 s of step time (7.5 s
    # and 5 s here) or 3 s of cost. Rank 2, named already, is not hidden for it.
    steps, times = _job({2: (1.3, 185, 200), 9: (1.3, 190, 200)})
    assert detect_stragglers(steps, times) == []
    assert len(detect_stragglers(steps, times, config=QUIET_HOST)) == 2
    found = detect_stragglers(steps, times, named_since=_since(r2=485))
    assert [(f.ranks, f.first_step, f.active) for f in found] == [((2,), 485, True)]


def test_a_named_rank_is_not_dropped_as_a_short_blip() -> None:
    # 1.105x slower for the last 8 steps of 1-s steps: costs 0.8 s but under 10% of its step
    # time, so a fresh episode that short is a blip (so far). Once named, it is not dropped.
    steps, times = _job({4: (1.105, 192, 200)}, step_s=1.0)
    assert detect_stragglers(steps, times) == []
    [f] = detect_stragglers(steps, times, named_since=_since(r4=492))
    assert f.ranks == (4,) and f.active and f.first_step == 492


def test_a_group_slowing_down_together_is_no_noisy_host() -> None:
    # Four ranks 1.15x slower from step 485 (7.5 s of 0.5-s steps): not yet the noisy-host
    # rule's 10 s, nor its 3 s of cost, but one group: named at once.
    group = (1, 4, 7, 10)
    steps, times = _job({r: (1.15, 185, 200) for r in group})
    found = detect_stragglers(steps, times)
    assert sorted(f.ranks[0] for f in found) == list(group)
    assert {f.first_step for f in found} == {485}
    # The noisy-host rule would hold the group back were it not one:
    assert detect_stragglers(steps, times, config=StragglerConfig(group_ranks=5)) == []


def test_two_ranks_together_or_three_apart_are_still_a_noisy_host() -> None:
    # Two ranks from the same step: no group (group_ranks is 3).
    steps, times = _job({r: (1.3, 185, 200) for r in (1, 4)})
    assert detect_stragglers(steps, times) == []
    assert len(detect_stragglers(steps, times, config=QUIET_HOST)) == 2
    # Three ranks, each slow from its own step (onsets 12 and 9 steps apart): scattered
    # blips, each held back until it lasted 10 s (8.4 s at most here, in 0.3-s steps).
    spread = {1: (1.3, 172, 200), 4: (1.3, 184, 200), 7: (1.3, 193, 200)}
    steps, times = _job(spread, step_s=0.3)
    assert detect_stragglers(steps, times) == []
    assert len(detect_stragglers(steps, times, config=QUIET_HOST)) == 3


def test_the_group_rule_is_configurable_and_validated() -> None:
    with pytest.raises(ValueError, match="group_ranks"):
        StragglerConfig(group_ranks=1)
    with pytest.raises(ValueError, match="group_steps"):
        StragglerConfig(group_steps=-1)


def test_a_groups_cost_counts_together() -> None:
    # Four ranks 1.15x slower for the last 10 of 0.3-s steps: 0.45 s each, under min_cost_s
    # (0.5 s) alone; 1.8 s together, for one cause.
    group = (2, 5, 8, 11)
    steps, times = _job({r: (1.15, 190, 200) for r in group}, step_s=0.3)
    apart = StragglerConfig(group_ranks=5, noisy_min_s=0.0)  # no group, no noisy-host rule
    assert detect_stragglers(steps, times, config=apart) == []
    found = detect_stragglers(steps, times)
    assert sorted(f.ranks[0] for f in found) == list(group)


def test_a_rank_that_slows_down_with_a_group_joins_it() -> None:
    # Four ranks 1.2x slower from step 450; rank 12 only 1.08x from the same step: under the
    # 10% threshold, at the hold level. One of the group. Rank 13, 1.08x slower from step
    # 400, before the group, and rank 14, one long pause at the group's onset, are not.
    slow: dict[int, tuple[float, int, int]] = {r: (1.2, 150, 200) for r in (1, 4, 7, 10)}
    slow |= {12: (1.08, 150, 200), 13: (1.08, 100, 200), 14: (1.5, 150, 151)}
    steps, times = _job(slow, noise=0.01)
    found = {f.ranks[0]: f for f in detect_stragglers(steps, times, baseline=np.ones(RANKS))}
    assert sorted(found) == [1, 4, 7, 10, 12]
    assert found[12].evidence["joined_group"] is True
    assert 450 <= found[12].first_step <= 453 and found[12].active
    assert "joined_group" not in found[1].evidence
    # Alone, rank 12 is no straggler: too mild.
    steps, times = _job({12: (1.08, 150, 200)}, noise=0.01)
    assert detect_stragglers(steps, times, baseline=np.ones(RANKS)) == []


def test_kept_normals_are_learned_from_learn_steps_steps() -> None:
    # Rank 3's first 20 steps happen to be 3% slow, its next 80 are normal: its normal is 1,
    # not 1.03 (which would put a rank of a group 1.10x slower at the hold level only).
    rng = np.random.default_rng(1)
    times = 1.0 + 0.003 * rng.standard_normal((RANKS, 150))
    times[3, :20] *= 1.03
    times[5, 30:] *= 1.2  # slow from step 30 (the median of 100 steps): keeps its first normal
    assert np.isnan(learn_baselines(np.arange(99), times[:, :99])).all()  # too early
    base = learn_baselines(np.arange(150), times)
    assert base[3] == pytest.approx(1.0, abs=0.006)
    assert base[5] == pytest.approx(1.0, abs=0.006)
    with pytest.raises(ValueError, match="learn_steps"):
        StragglerConfig(baseline_steps=30, learn_steps=20)


def test_two_ranks_and_those_that_join_them_are_a_group() -> None:
    # Ranks 1 and 4 cross the threshold from step 485 (7.5 s of 0.5-s steps); ranks 7 and
    # 10, slowed at the same step, only reach 1.08x: with them it is a group of four, named
    # at once. Without them, two ranks' episodes that short are a noisy host's.
    slow = {1: (1.2, 185, 200), 4: (1.2, 185, 200), 7: (1.08, 185, 200), 10: (1.08, 185, 200)}
    steps, times = _job(slow, noise=0.01)
    found = {f.ranks[0]: f for f in detect_stragglers(steps, times, baseline=np.ones(RANKS))}
    assert sorted(found) == [1, 4, 7, 10]
    assert sorted(r for r, f in found.items() if f.evidence.get("joined_group")) == [7, 10]
    steps, times = _job({1: (1.2, 185, 200), 4: (1.2, 185, 200)}, noise=0.01)
    assert detect_stragglers(steps, times, baseline=np.ones(RANKS)) == []

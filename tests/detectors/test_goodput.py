"""Goodput accounting on hand-built timelines with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from detectors.goodput import (
    BADPUT,
    CATEGORIES,
    Attempt,
    CheckpointSave,
    Goodput,
    Hang,
    Straggler,
    account,
    as_dict,
)

T0 = 1000.0


def run(
    attempt: int,
    steps: range,
    *,
    start: float,
    step_s: float = 1.0,
    duration: float | None = None,
    data: float | None = None,
    extra: dict[int, float] | None = None,
) -> Attempt:
    """Steps back to back from ``start``, each ``step_s`` long (plus ``extra[step]`` before
    it); ``duration`` (default ``step_s``) is the part inside the step marker."""
    ends, t = [], start
    for n in steps:
        t += (extra or {}).get(n, 0.0) + step_s
        ends.append(t)
    k = len(ends)
    return Attempt(
        attempt=attempt,
        steps=list(steps),
        ends=ends,
        durations=[duration if duration is not None else step_s] * k,
        data_s=None if data is None else [data] * k,
    )


def check_partition(g: Goodput) -> None:
    assert set(g.seconds) == set(CATEGORIES)
    assert all(v >= 0 for v in g.seconds.values()), g.seconds
    assert sum(g.seconds.values()) == pytest.approx(g.total_s, abs=1e-6)


def test_clean_run_goodput_is_compute_over_total() -> None:
    # 100 one-second slots: 0.8 s inside the step marker; of the 0.2 s gap before each step,
    # 0.1 s is data wait (data_s) and 0.1 s is unexplained.
    a = run(0, range(100), start=T0, duration=0.8, data=0.1)
    g = account([a], end=T0 + 100)
    check_partition(g)
    # The first step has no gap before it: its data wait lies inside its window.
    assert g.start == pytest.approx(T0 + 0.2)
    assert g.total_s == pytest.approx(99.8)
    assert g.seconds["data_loading"] == pytest.approx(10.0)
    assert g.productive_s == pytest.approx(0.7 + 99 * 0.8)
    assert g.seconds["other"] == pytest.approx(99 * 0.1)
    assert g.goodput == pytest.approx((0.7 + 99 * 0.8) / 99.8)
    assert (g.restarts, g.steps_lost, g.steps_productive) == (0, 0, 100)
    for k in ("wasted_progress", "disruption_recovery", "hang", "checkpointing"):
        assert g.seconds[k] == 0


def restart_case(duration_known: bool) -> Goodput:
    # Attempt 0 saves a checkpoint after step 50 (2 s), reaches step 80, crashes; the
    # restart takes 60 s and resumes at step 51.
    a0 = run(0, range(81), start=T0, extra={51: 2.0})
    assert a0.ends[-1] == T0 + 83  # type: ignore[index]
    a1 = run(1, range(51, 100), start=T0 + 83 + 60)
    save = CheckpointSave(ts=T0 + 53, step=50, duration_s=2.0 if duration_known else None)
    return account([a1, a0], end=T0 + 192, checkpoints=[save])


@pytest.mark.parametrize("duration_known", [True, False])
def test_restart_from_checkpoint_wastes_the_redone_steps(duration_known: bool) -> None:
    g = restart_case(duration_known)
    check_partition(g)
    assert g.total_s == pytest.approx(192)
    assert g.seconds["wasted_progress"] == pytest.approx(30)
    assert g.seconds["disruption_recovery"] == pytest.approx(60)
    assert g.seconds["checkpointing"] == pytest.approx(2)
    assert g.productive_s == pytest.approx(100)
    assert g.goodput == pytest.approx(100 / 192)
    assert (g.restarts, g.steps_lost, g.steps_productive) == (1, 30, 100)
    assert g.seconds["other"] == pytest.approx(0, abs=1e-9)


def test_rolling_back_further_loses_earlier_attempts_steps_too() -> None:
    a0 = run(0, range(81), start=T0)  # ends at T0 + 81
    a1 = run(1, range(51, 61), start=T0 + 91)  # ends at T0 + 101, resumed at 51
    a2 = run(2, range(40, 100), start=T0 + 111)  # resumed at 40: 40..50 of a0 lost too
    g = account([a0, a1, a2], end=T0 + 171)
    check_partition(g)
    assert g.steps_lost == (81 - 40) + 10
    assert g.seconds["wasted_progress"] == pytest.approx(51)
    assert g.seconds["disruption_recovery"] == pytest.approx(20)
    assert g.productive_s == pytest.approx(100)
    assert g.restarts == 2


def test_hang_then_restart_counts_hang_until_resolved_then_downtime() -> None:
    # Steps 0..99, then no progress: detected 30 s later, killed at 40 s, the restart
    # resumes at step 100 (nothing lost) 50 s after the last step.
    a0 = run(0, range(100), start=T0)
    a1 = run(1, range(100, 110), start=T0 + 150)
    g = account([a0, a1], end=T0 + 160, hangs=[Hang(start=T0 + 130, end=T0 + 140)])
    check_partition(g)
    assert g.seconds["hang"] == pytest.approx(40)
    assert g.seconds["disruption_recovery"] == pytest.approx(10)
    assert g.productive_s == pytest.approx(110)
    assert g.steps_lost == 0


def test_hang_that_ends_at_last_activity_when_known() -> None:
    a0 = run(0, range(100), start=T0)
    a0 = Attempt(0, a0.steps, a0.ends, a0.durations, last_activity=T0 + 135)
    a1 = run(1, range(100, 110), start=T0 + 150)
    g = account([a0, a1], end=T0 + 160, hangs=[Hang(start=T0 + 130)])
    assert g.seconds["hang"] == pytest.approx(35)
    assert g.seconds["disruption_recovery"] == pytest.approx(15)


def test_hang_inside_a_step_counts_its_excess_over_a_normal_step() -> None:
    # Step 50 is stuck in a collective for 40 s, then the job goes on by itself.
    a = run(0, range(100), start=T0, extra={50: 40.0})
    a = Attempt(0, a.steps, a.ends, [1.0] * 50 + [41.0] + [1.0] * 49)
    g = account([a], end=T0 + 140, hangs=[Hang(start=T0 + 80, end=T0 + 91)])
    check_partition(g)
    assert g.seconds["hang"] == pytest.approx(40)
    assert g.productive_s == pytest.approx(100)


def test_open_hang_at_the_end_of_the_window() -> None:
    a = run(0, range(100), start=T0)
    g = account([a], end=T0 + 145, hangs=[Hang(start=T0 + 130)])
    check_partition(g)
    assert g.seconds["hang"] == pytest.approx(45)
    assert g.seconds["other"] == pytest.approx(0, abs=1e-9)


def test_straggler_costs_the_excess_over_the_baseline() -> None:
    # 100 steps at 1.0 s, then a rank slows the job by 20% for 100 steps.
    fast = run(0, range(100), start=T0)
    slow = run(0, range(100, 200), start=T0 + 100, step_s=1.2)
    a = Attempt(
        0,
        [*fast.steps, *slow.steps],  # type: ignore[misc]
        [*fast.ends, *slow.ends],  # type: ignore[misc]
        [*fast.durations, *slow.durations],  # type: ignore[misc]
    )
    g = account([a], end=T0 + 220, stragglers=[Straggler(start=T0 + 100, first_step=100)])
    check_partition(g)
    assert g.seconds["straggler_slowdown"] == pytest.approx(20)
    assert g.productive_s == pytest.approx(200)
    # A given baseline wins; a step range bounds the episode.
    g = account([a], end=T0 + 220, stragglers=[Straggler(T0 + 100, last_step=149, baseline_s=1.1)])
    assert g.seconds["straggler_slowdown"] == pytest.approx(5)
    # Overlapping episodes count each step once.
    twice = [Straggler(start=T0 + 100), Straggler(start=T0 + 150)]
    assert account([a], end=T0 + 220, stragglers=twice).seconds[
        "straggler_slowdown"
    ] == pytest.approx(20)


def test_straggler_without_history_counts_nothing() -> None:
    a = run(0, range(10), start=T0)
    g = account([a], end=T0 + 10, stragglers=[Straggler(start=T0 - 5)])
    assert g.seconds["straggler_slowdown"] == 0


def test_checkpoint_inside_the_step_and_located_by_step() -> None:
    # The save happens inside step 11's marker (no gap); the event has no timestamp.
    a = run(0, range(20), start=T0, extra={11: 3.0})
    a = Attempt(0, a.steps, a.ends, [1.0] * 11 + [4.0] + [1.0] * 8)
    g = account([a], end=T0 + 23, checkpoints=[CheckpointSave(step=10, duration_s=3.0)])
    check_partition(g)
    assert g.seconds["checkpointing"] == pytest.approx(3)
    assert g.productive_s == pytest.approx(20)


def test_empty_and_degenerate_inputs() -> None:
    g = account([], end=T0)
    assert (g.total_s, g.goodput, g.steps_lost) == (0, None, 0)
    g = account([Attempt(0, [], [], [])], end=T0)
    assert g.goodput is None
    # The window never ends before the last step; saves outside it are ignored.
    a = run(0, range(10), start=T0)
    g = account([a], end=T0 - 100, checkpoints=[CheckpointSave(ts=T0 + 999, duration_s=5)])
    assert g.total_s == pytest.approx(10)
    assert g.seconds["checkpointing"] == 0
    with pytest.raises(ValueError, match="differ in size"):
        account([Attempt(0, [1, 2], [T0], [1.0])], end=T0)


def test_clock_skew_between_attempts_never_goes_negative() -> None:
    a0 = run(0, range(50), start=T0)
    a1 = run(1, range(40, 60), start=T0 + 45)  # starts before attempt 0 "ended"
    g = account([a0, a1], end=T0 + 70)
    check_partition(g)
    assert g.steps_lost == 10


@pytest.mark.parametrize("seed", range(20))
def test_categories_are_non_negative_and_sum_to_total(seed: int) -> None:
    rng = np.random.default_rng(seed)
    attempts, t, step = [], T0, 0
    for k in range(int(rng.integers(1, 5))):
        n = int(rng.integers(1, 60))
        steps = np.arange(step, step + n)
        dur = rng.exponential(1.0, n)
        gaps = rng.exponential(0.3, n) * (rng.random(n) < 0.5)
        ends = t + np.cumsum(dur + gaps) + rng.normal(0, 0.2, n)  # some skew
        attempts.append(Attempt(k, steps, ends, dur, rng.exponential(0.5, n)))
        t = float(ends.max()) + float(rng.exponential(20))
        step = max(0, step + n - int(rng.integers(0, n + 5)))
    lo, hi = T0 - 10, t + 30
    g = account(
        attempts,
        end=hi,
        checkpoints=[
            CheckpointSave(ts=float(rng.uniform(lo, hi)), duration_s=float(rng.exponential(2)))
            for _ in range(5)
        ]
        + [CheckpointSave(step=int(rng.integers(0, 50))) for _ in range(3)],
        hangs=[Hang(float(rng.uniform(lo, hi)), float(rng.uniform(lo, hi))) for _ in range(3)]
        + [Hang(float(rng.uniform(lo, hi)))],
        stragglers=[Straggler(float(rng.uniform(lo, hi))) for _ in range(2)],
    )
    check_partition(g)
    assert 0 <= (g.goodput or 0) <= 1
    out = as_dict(g)
    assert set(out["badput"]) == set(BADPUT)
    assert out["total_s"] == g.total_s

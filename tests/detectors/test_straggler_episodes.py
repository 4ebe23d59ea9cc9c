"""The vectorized episode bookkeeping (``detectors/straggler_episodes.py``) gives exactly the
findings of the per-rank path it replaced (``straggler_oracle.py``), on random windows that
exercise every rule: groups and single stragglers, short blips, several episodes per rank,
recoveries, missing steps, collective waits or none, carried baselines or none, ranks named
by earlier windows or none, two ranks.
"""

from __future__ import annotations

import numpy as np
import pytest

from detectors.straggler import DEFAULT_CONFIG, StragglerConfig, _prepare, detect_stragglers
from tests.detectors.straggler_oracle import report_per_rank


def random_window(seed: int) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    n_ranks = int(rng.choice([2, 3, 4, 8, 16, 40]))
    n_steps = int(rng.integers(1, 240))
    step_s = float(rng.uniform(0.02, 3.0))
    noise = float(rng.uniform(0.003, 0.06))
    times = step_s * (1.0 + noise * rng.standard_normal((n_ranks, n_steps)))
    times *= 1.0 + 0.02 * rng.standard_normal(n_steps)
    for _ in range(int(rng.integers(0, 6))):  # slow episodes: groups, blips, recoveries
        group = rng.choice(n_ranks, int(rng.integers(1, max(2, n_ranks // 2) + 1)), replace=False)
        lo = int(rng.integers(0, n_steps))
        if rng.random() < 0.3:  # still slow at the window's end
            lo = max(0, n_steps - int(rng.integers(5, 12)))
        hi = lo + int(rng.choice([3, 6, 9, 12, 30, 400]))
        times[group, lo:hi] *= float(rng.choice([1.06, 1.09, 1.11, 1.13, 1.2, 1.5, 2.5]))
    if rng.random() < 0.3:
        times[rng.random(times.shape) < rng.uniform(0.01, 0.2)] = np.nan
    if rng.random() < 0.2:
        times[int(rng.integers(n_ranks)), int(rng.integers(n_steps)) :] = np.nan
    comm = None
    if rng.random() < 0.5:
        compute = times.copy()
        step = np.nanmax(compute, axis=0, initial=0.0) + 0.05 * step_s
        comm = step[None, :] - compute
        times = np.where(np.isnan(compute), np.nan, np.broadcast_to(step, compute.shape))
        if rng.random() < 0.3:
            comm[rng.random(comm.shape) < 0.05] = np.nan
    baseline = None
    if rng.random() < 0.5:
        baseline = rng.uniform(1.0, 1.12, n_ranks)
        baseline[rng.random(n_ranks) < 0.2] = np.nan
    steps = 1000 + np.cumsum(rng.integers(1, 3, n_steps))
    named_since = None
    if rng.random() < 0.4:  # ranks named by earlier windows: since before this one, or in it
        named_since = np.full(n_ranks, np.nan)
        named = rng.random(n_ranks) < 0.4
        named_since[named] = rng.integers(900, steps[-1] + 1, int(named.sum()))
    return {
        "steps": steps,
        "step_time": times,
        "comm_time": comm,
        "ranks": rng.permutation(n_ranks) * 3 + 5,
        "baseline": baseline,
        "named_since": named_since,
    }


def per_rank(window: dict[str, object], cfg: StragglerConfig = DEFAULT_CONFIG) -> list[object]:
    prep = _prepare(
        window["steps"],  # type: ignore[arg-type]
        window["step_time"],  # type: ignore[arg-type]
        window["comm_time"],  # type: ignore[arg-type]
        window["ranks"],  # type: ignore[arg-type]
        window["baseline"],  # type: ignore[arg-type]
        cfg,
        window.get("named_since"),  # type: ignore[arg-type]
    )
    return [] if prep is None else list(report_per_rank(prep, cfg))


@pytest.mark.parametrize("chunk", range(4))
def test_vectorized_episodes_equal_the_per_rank_path_on_random_windows(chunk: int) -> None:
    found = 0
    for seed in range(chunk * 150, (chunk + 1) * 150):
        window = random_window(seed)
        got = detect_stragglers(**window)  # type: ignore[arg-type]
        # repr: NaN evidence compares equal to itself, and the evidence's key order counts.
        assert repr(got) == repr(per_rank(window)), seed
        found += len(got)
    assert found > 50  # the random windows do name stragglers


def test_equal_with_a_configuration_that_changes_every_rule() -> None:
    cfg = StragglerConfig(
        persist_k=3, persist_m=6, blip_steps=20, min_cost_s=0.05, noisy_min_s=2.0, hold_share=0.7
    )
    found = 0
    for seed in range(1000, 1150):
        window = random_window(seed)
        got = detect_stragglers(**window, config=cfg)  # type: ignore[arg-type]
        assert repr(got) == repr(per_rank(window, cfg)), seed
        found += len(got)
    assert found > 50


def test_equal_on_a_large_group() -> None:
    """512 ranks, 128 of them 1.2x slower from step 80, a few blips elsewhere."""
    rng = np.random.default_rng(7)
    times = 0.4 * (1.0 + 0.02 * rng.standard_normal((512, 200)))
    times[rng.choice(512, 128, replace=False), 80:] *= 1.2
    times[3, 30:36] *= 1.6
    window = {"steps": np.arange(200), "step_time": times, "comm_time": None}
    window |= {"ranks": None, "baseline": None}
    got = detect_stragglers(**window)  # type: ignore[arg-type]
    assert len(got) >= 128
    assert repr(got) == repr(per_rank(window))


def test_equal_on_a_short_mild_episode_still_going_and_one_that_ended() -> None:
    """The blip rule's two sides: 1.2x for the window's last 7 steps is reported (it may
    go on), the same 7 steps earlier in the window are not (mild, short and over)."""
    rng = np.random.default_rng(8)
    times = 1.0 + 0.005 * rng.standard_normal((8, 100))
    times[2, 93:] *= 1.2
    times[5, 40:47] *= 1.2
    window = {"steps": np.arange(100), "step_time": times, "comm_time": None}
    window |= {"ranks": None, "baseline": None}
    got = detect_stragglers(**window)  # type: ignore[arg-type]
    assert [(f.ranks, f.active) for f in got] == [((2,), True)]
    assert repr(got) == repr(per_rank(window))

"""Straggler detector: hand-built windows with known answers, and a real PAI job."""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from detectors.robust import mad_scale_rows, nanmedian_rows
from detectors.straggler import StragglerConfig, detect_stragglers

PAI_CSV = Path(__file__).resolve().parents[1] / "data" / "pai_minibatch" / "job_1_norm.csv"

Array = npt.NDArray[np.float64]


def jittered(ranks: int, steps: int, *, seed: int, mean: float = 0.5, noise: float = 0.02) -> Array:
    """Step times of healthy ranks: ``mean`` seconds with relative Gaussian noise."""
    rng = np.random.default_rng(seed)
    times: Array = mean * (1.0 + noise * rng.standard_normal((ranks, steps)))
    return times


@pytest.fixture(autouse=True)
def no_warnings() -> Iterator[None]:
    """NaN-heavy input must not make numpy warn (warnings would flood worker logs)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def test_uniform_ranks_with_noise_give_no_findings() -> None:
    for seed in range(5):
        times = jittered(64, 200, seed=seed, noise=0.03)
        assert detect_stragglers(np.arange(200), times) == []


def test_isolated_slow_steps_do_not_fire() -> None:
    """GC pauses, a checkpoint, a noisy neighbour for one step: not a straggler."""
    times = jittered(64, 200, seed=1)
    spikes = np.random.default_rng(2).random(times.shape) < 0.02
    times[spikes] *= 1.6
    times[7, [20, 22, 60, 61, 62, 63]] *= 1.5  # one rank, twice, under the persistence rule
    assert detect_stragglers(np.arange(200), times) == []


def test_rank_turning_30_percent_slower_is_found_near_onset() -> None:
    steps = 1000 + np.arange(200)
    times = jittered(32, 200, seed=3)
    times[5, 50:] *= 1.3

    [finding] = detect_stragglers(steps, times)

    assert finding.kind == "straggler"
    assert finding.key == "straggler:5"
    assert finding.ranks == (5,)
    assert finding.active and finding.last_step is None
    assert finding.first_step is not None and 1050 <= finding.first_step <= 1053
    assert finding.severity == "warning"
    assert finding.score > 3
    ev = finding.evidence
    assert ev["ratio"] == pytest.approx(1.3, abs=0.03)
    assert ev["rank_compute_s"] == pytest.approx(0.65, abs=0.02)
    assert ev["median_compute_s"] == pytest.approx(0.5, abs=0.01)
    assert ev["baseline_ratio"] == pytest.approx(1.0, abs=0.02)
    assert ev["steps_over_threshold"] >= 140
    assert finding.first_step <= ev["detected_step"] <= 1050 + 8
    assert "rank 5" in finding.summary and "since step" in finding.summary
    json.dumps(ev)  # evidence goes into incidents as JSON


def test_rank_with_constant_slower_baseline_is_not_a_straggler() -> None:
    """Heterogeneous hardware: ranks 10-15% slower from the start are their own normal."""
    times = jittered(32, 200, seed=4)
    times[0:3] *= 1.10
    times[3] *= 1.14
    assert detect_stragglers(np.arange(200), times) == []


def test_slower_baseline_rank_that_slows_down_further_is_found() -> None:
    times = jittered(32, 200, seed=5)
    times[0:3] *= 1.10
    times[1, 120:] *= 1.25  # 1.10 -> 1.375 of the median: a change of +25% for that rank
    [finding] = detect_stragglers(np.arange(200), times)
    assert finding.ranks == (1,)
    assert finding.first_step is not None and 120 <= finding.first_step <= 123
    assert finding.evidence["baseline_ratio"] == pytest.approx(1.10, abs=0.02)
    assert finding.evidence["ratio"] == pytest.approx(1.375, abs=0.04)


def test_rank_already_far_slower_when_the_window_opens_fires_from_its_first_step() -> None:
    """The per-rank baseline absorbs at most ``max_baseline_ratio`` (1.15)."""
    steps = 500 + np.arange(100)
    times = jittered(16, 100, seed=6)
    times[9] *= 1.6
    [finding] = detect_stragglers(steps, times)
    assert finding.ranks == (9,)
    assert finding.first_step == 500
    assert finding.active
    assert finding.severity == "critical"


def test_caller_supplied_baseline_overrides_the_window_estimate() -> None:
    """A straggler older than the window (1.2x) looks normal to a window-only baseline;
    the baseline the backend kept from earlier windows (1.0) exposes it."""
    times = jittered(16, 100, seed=7)
    times[4] *= 1.2
    assert detect_stragglers(np.arange(100), times) == []
    [finding] = detect_stragglers(np.arange(100), times, baseline=np.ones(16))
    assert finding.ranks == (4,)
    assert finding.first_step == 0


def test_transient_straggler_is_reported_as_recovered() -> None:
    times = jittered(32, 200, seed=8)
    times[9, 40:71] *= 1.6  # slow at steps 40..70

    [finding] = detect_stragglers(np.arange(200), times)

    assert finding.key == "straggler:9"
    assert not finding.active
    assert finding.first_step == 40
    assert finding.last_step == 70
    assert finding.severity == "critical"
    assert finding.evidence["ratio"] == pytest.approx(1.6, abs=0.05)
    assert "recovered" in finding.summary


def test_two_episodes_report_the_latest_and_list_the_earlier() -> None:
    times = jittered(32, 200, seed=9)
    times[2, 30:50] *= 1.5
    times[2, 150:] *= 1.5
    [finding] = detect_stragglers(np.arange(200), times)
    assert finding.active
    assert finding.first_step == 150
    assert finding.evidence["earlier_episodes"] == [[30, 49]]


def sync_job(ranks: int, steps: int, *, slow_rank: int, slow_from: int) -> tuple[Array, Array]:
    """A synchronous data-parallel job: every step ends in an all-reduce that waits for the
    slowest rank, so every rank sees the same step time; faster ranks wait longer."""
    rng = np.random.default_rng(10)
    compute = 0.6 * (1.0 + 0.01 * rng.standard_normal((ranks, steps)))
    compute[slow_rank, slow_from:] = 0.85 * (1.0 + 0.01 * rng.standard_normal(steps - slow_from))
    all_reduce = 0.1
    step = compute.max(axis=0) + all_reduce  # the same for all ranks
    step_time = np.broadcast_to(step, (ranks, steps)).copy()
    comm_time = step_time - compute  # time waiting in, and running, the collective
    return step_time, comm_time


def test_sync_job_slow_rank_is_the_one_that_waits_least_in_collectives() -> None:
    step_time, comm_time = sync_job(16, 120, slow_rank=11, slow_from=30)
    assert np.ptp(step_time, axis=0).max() == 0  # step times carry no signal at all
    assert (comm_time[:, 30:].argmin(axis=0) == 11).all()  # the slow rank waits least

    [finding] = detect_stragglers(np.arange(120), step_time, comm_time)

    assert finding.ranks == (11,)
    assert finding.first_step == 30
    assert finding.active
    assert finding.evidence["basis"] == "compute"
    assert finding.evidence["ratio"] == pytest.approx(0.85 / 0.6, abs=0.03)
    assert finding.evidence["rank_compute_s"] == pytest.approx(0.85, abs=0.01)
    assert "computes" in finding.summary
    # Step time alone cannot see it: that is why the collector reports comm_s.
    assert detect_stragglers(np.arange(120), step_time) == []


def test_missing_samples_are_tolerated() -> None:
    rng = np.random.default_rng(11)
    times = jittered(32, 200, seed=12)
    times[4, 80:] *= 1.3
    times[rng.random(times.shape) < 0.10] = np.nan  # 10% of samples lost
    times[:, 100] = np.nan  # a step nobody reported
    times[:28, 101] = np.nan  # a step too few ranks reported
    times[20, :30] = np.nan  # a rank that joined late
    times[21] = np.nan  # a rank that never reported
    times[30, 150] *= 2.0  # a rank slow once, then silent (crashed): not a straggler
    times[30, 151:] = np.nan

    [finding] = detect_stragglers(np.arange(200), times)

    assert finding.ranks == (4,)
    assert finding.first_step is not None and 80 <= finding.first_step <= 84
    assert finding.active
    assert finding.evidence["steps_observed"] < 120  # the gaps are accounted for


def test_tiny_absolute_differences_never_fire() -> None:
    """Near-identical ranks: the scale floor keeps z finite, the 10% rule keeps 5% quiet."""
    times = jittered(16, 100, seed=13, noise=1e-7)
    times[3, 50:] *= 1.05
    assert detect_stragglers(np.arange(100), times) == []
    times[3, 50:] *= 1.10  # now 15.5% slower
    [finding] = detect_stragglers(np.arange(100), times)
    assert finding.ranks == (3,) and finding.first_step == 50


def test_rank_ids_name_the_findings() -> None:
    times = jittered(8, 60, seed=14)
    times[6, 20:] *= 1.4
    [finding] = detect_stragglers(np.arange(60), times, ranks=np.arange(100, 108))
    assert finding.ranks == (106,) and finding.key == "straggler:106"


def test_too_few_ranks_or_steps_give_nothing() -> None:
    assert detect_stragglers(np.arange(50), jittered(2, 50, seed=15)) == []
    assert detect_stragglers(np.arange(0), np.zeros((8, 0))) == []


@pytest.mark.parametrize(
    ("steps", "shape", "kwargs", "message"),
    [
        (np.arange(10), (4, 9), {}, "step_time"),
        (np.array([0, 1, 1, 2]), (4, 4), {}, "increasing"),
        (np.arange(10), (4, 10), {"comm_time": np.zeros((4, 9))}, "comm_time"),
        (np.arange(10), (4, 10), {"ranks": [0, 1, 2]}, "ranks"),
        (np.arange(10), (4, 10), {"baseline": [1.0]}, "baseline"),
    ],
)
def test_bad_input_is_refused_with_the_field_named(
    steps: npt.NDArray[np.int64], shape: tuple[int, int], kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        detect_stragglers(steps, np.ones(shape), **kwargs)  # type: ignore[arg-type]


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        StragglerConfig(persist_k=9, persist_m=8)
    with pytest.raises(ValueError):
        StragglerConfig(rel_threshold=0)


def load_pai_job_1() -> tuple[npt.NDArray[np.int64], Array]:
    """The PAI CSV pivoted to (workers x samples); ``time`` is the iteration."""
    data = np.genfromtxt(PAI_CSV, delimiter=",", skip_header=1)
    worker = data[:, 1].astype(np.int64)
    iteration = data[:, 3].astype(np.int64)
    iterations = np.unique(iteration)
    times = np.full((worker.max() + 1, iterations.size), np.nan)
    times[worker, np.searchsorted(iterations, iteration)] = data[:, 4]
    return iterations, times


def test_pai_job_1_worker_6_is_the_only_straggler() -> None:
    iterations, times = load_pai_job_1()
    assert times.shape == (10, 300) and not np.isnan(times).any()

    findings = detect_stragglers(iterations, times)

    assert [f.ranks for f in findings] == [(6,)]  # workers 0-2 (~10% slower) stay quiet
    [finding] = findings
    assert finding.first_step is not None and 1800 <= finding.first_step <= 2000
    assert not finding.active  # it recovered within the recording
    assert finding.last_step is not None and finding.first_step < finding.last_step <= 2000
    assert finding.severity == "critical"
    latency = finding.evidence["detected_step"] - finding.first_step
    assert 0 <= latency <= 80  # iterations; samples are 10 iterations apart


def test_pai_job_1_sliding_windows() -> None:
    """As the backend calls it: overlapping windows, each judged on its own."""
    iterations, times = load_pai_job_1()
    first_seen = None
    for end in range(100, 301, 10):
        window = slice(end - 100, end)
        for finding in detect_stragglers(iterations[window], times[:, window]):
            assert finding.ranks == (6,)
            assert finding.first_step is not None and 1800 <= finding.first_step <= 2000
            first_seen = first_seen or int(iterations[end - 1])
    assert first_seen is not None and first_seen <= 1900


def test_16k_ranks_x_200_steps_timing() -> None:
    steps = np.arange(200)
    times = jittered(16384, 200, seed=16, noise=0.01)
    times[12345, 120:] *= 1.3
    detect_stragglers(steps, times[:64])  # warm up imports and caches

    start = time.perf_counter()
    findings = detect_stragglers(steps, times)
    elapsed_ms = (time.perf_counter() - start) * 1e3

    print(f"\ndetect_stragglers 16384 ranks x 200 steps: {elapsed_ms:.1f} ms")
    assert [f.ranks for f in findings] == [(12345,)]
    assert findings[0].first_step == 120


def test_nanmedian_rows_matches_numpy() -> None:
    rng = np.random.default_rng(17)
    for n in range(1, 9):
        values = rng.standard_normal((40, n))
        values[rng.random(values.shape) < 0.4] = np.nan
        values[rng.random(values.shape) < 0.05] = np.inf
        clean = np.where(np.isfinite(values), values, np.nan)
        all_missing = np.isnan(clean).all(axis=1)
        expected = np.full(40, np.nan)
        expected[~all_missing] = np.nanmedian(clean[~all_missing], axis=1)
        np.testing.assert_allclose(nanmedian_rows(values), expected)
        np.testing.assert_allclose(
            nanmedian_rows(values.astype(np.float32)), expected, rtol=1e-6, atol=1e-6
        )


def test_mad_scale_rows_has_a_floor() -> None:
    rows = np.array([[1.0, 2.0, 3.0, np.nan], [5.0, 5.0, 5.0, 5.0]])
    np.testing.assert_allclose(
        mad_scale_rows(rows, center=[2.0, 5.0], floor=0.1), [1.4826, 0.1], rtol=1e-6
    )


# --- issue 17: two-rank jobs, and one-rank blips ---------------------------------------------


def test_two_rank_job_names_the_rank_that_waits_least() -> None:
    """README's example is 2 ranks: the slow one is still the one that waits least."""
    step_time, comm_time = sync_job(2, 120, slow_rank=1, slow_from=30)

    [finding] = detect_stragglers(np.arange(120), step_time, comm_time)

    assert finding.ranks == (1,) and finding.first_step == 30 and finding.active
    assert finding.evidence["compared_with"] == "the other rank"
    assert finding.evidence["ratio"] == pytest.approx(0.85 / 0.6, abs=0.05)


def test_two_rank_job_without_a_fault_or_without_waits_gives_nothing() -> None:
    for seed in range(5):
        compute = 0.6 * (1.0 + 0.02 * np.random.default_rng(seed).standard_normal((2, 200)))
        step = np.broadcast_to(compute.max(axis=0) + 0.1, (2, 200)).copy()
        assert detect_stragglers(np.arange(200), step, step - compute) == []
    # Without collective waits two ranks show the same step time: nothing to tell apart.
    step_time, _ = sync_job(2, 120, slow_rank=1, slow_from=30)
    assert detect_stragglers(np.arange(120), step_time) == []


def test_a_short_mild_blip_that_is_already_over_is_noise() -> None:
    """One rank 1.2x slower for 6 steps (the OS took its core): no incident."""
    times = jittered(4, 200, seed=21, noise=0.005)
    times[0, 40:46] *= 1.2
    assert detect_stragglers(np.arange(200), times) == []
    times[0, 40:46] *= 1.5  # 1.8x: a real (if short) episode is still reported
    [finding] = detect_stragglers(np.arange(200), times)
    assert finding.ranks == (0,) and not finding.active

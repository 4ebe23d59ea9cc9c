"""NaN/Inf and loss-spike detection on synthetic runs with known answers."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from detectors.numerics import NumericsConfig, detect_numerics

R, S = 64, 300


def run(seed: int = 0, ranks: int = R, steps: int = S) -> np.ndarray:
    """A fresh run: steep early decline to ~2.0, per-rank and job-wide noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps)
    curve = 2.0 + 8.0 * np.exp(-t / 15.0)
    return curve + rng.normal(0, 0.05, (ranks, steps)) + rng.normal(0, 0.02, (1, steps))


def kinds(findings: list) -> list[str]:
    return [f.kind for f in findings]


@pytest.mark.parametrize("seed", range(20))
def test_clean_runs_with_steep_early_decline_produce_nothing(seed: int) -> None:
    assert detect_numerics(run(seed), np.ones((R, S))) == []


def test_spike_that_passed_is_found_with_onset_and_inactive() -> None:
    loss = run(1)
    loss[:, 200:203] += 1.5
    steps = np.arange(S) + 1000

    (f,) = detect_numerics(loss, steps=steps)

    assert (f.kind, f.key, f.severity, f.ranks) == ("loss_spike", "loss_spike", "warning", ())
    assert f.first_step == 1200
    assert f.last_step == 1202
    assert not f.active
    assert f.score >= 6
    assert f.evidence["peak_loss"] == pytest.approx(3.5, abs=0.1)
    assert f.evidence["ewma_before"] == pytest.approx(2.0, abs=0.05)
    assert "\n" not in f.summary and f.summary.startswith("loss spiked to 3.")
    assert "at step 1200" in f.summary


def test_spike_still_under_way_is_active() -> None:
    loss = run(2)
    loss[:, 290:] += 1.0

    (f,) = detect_numerics(loss)

    assert f.kind == "loss_spike" and f.active
    assert f.first_step == 290 and f.last_step == S - 1


def test_only_upward_moves_count() -> None:
    loss = run(3)
    loss[:, 200:] -= 1.0  # a sudden improvement is no alarm
    assert detect_numerics(loss) == []


def test_spikes_in_warmup_or_before_ignore_step_are_ignored() -> None:
    loss = run(4)
    loss[:, 10] += 5.0  # inside the 20-step warm-up
    assert detect_numerics(loss) == []
    loss[:, 150] += 1.5
    assert kinds(detect_numerics(loss)) == ["loss_spike"]
    assert detect_numerics(loss, config=NumericsConfig(ignore_before_step=160)) == []


def test_latest_of_several_episodes_is_reported() -> None:
    loss = run(5)
    loss[:, 100] += 1.5
    loss[:, 250] += 2.0

    (f,) = detect_numerics(loss)

    assert f.first_step == 250 and f.evidence["episodes_in_window"] == 2


def test_one_rank_bad_batch_does_not_move_the_job_loss() -> None:
    loss = run(6)
    loss[7, 200] = 50.0
    assert detect_numerics(loss) == []


def test_nan_names_the_first_rank_and_step() -> None:
    loss = run(7)
    loss[5, 120] = np.nan  # rank 5 blows up first ...
    loss[:, 121:] = np.inf  # ... then everyone, after the all-reduce
    steps = np.arange(S) + 5000

    findings = detect_numerics(loss, np.ones((R, S)), steps=steps)

    (f,) = [f for f in findings if f.kind == "nan"]
    assert (f.key, f.severity, f.ranks, f.first_step) == ("nan", "critical", (5,), 5120)
    assert f.active
    assert f.evidence["ranks_affected"] == R
    assert f.evidence["loss_first_value"] == "NaN"
    assert "rank 5 at step 5120" in f.summary


def test_inf_in_grad_norm_alone_is_critical() -> None:
    grad = np.ones((R, S))
    grad[[3, 9], 77] = np.inf

    (f,) = detect_numerics(run(8), grad)

    assert f.kind == "nan" and f.ranks == (3, 9) and f.first_step == 77
    assert f.evidence["grad_norm_first_value"] == "Inf"
    assert not f.active and f.last_step == 77  # finite again at the end of the window
    assert "grad norm Inf" in f.summary


def test_all_nan_column_is_found_and_does_not_disturb_spike_detection() -> None:
    loss = run(9)
    loss[:, 150] = np.nan

    (f,) = detect_numerics(loss)

    assert f.kind == "nan" and f.first_step == 150 and len(f.ranks) == R and not f.active


def test_unreported_entries_are_not_nan_alarms() -> None:
    loss = run(10)
    reported = np.ones((R, S), dtype=bool)
    loss[:, 140:150] = np.nan  # the pivot's "no value"
    reported[:, 140:150] = False
    assert detect_numerics(loss, reported=reported) == []
    loss[2, 160] = np.nan  # a real NaN still counts
    (f,) = detect_numerics(loss, reported=reported)
    assert f.kind == "nan" and f.ranks == (2,) and f.first_step == 160


def test_constant_loss_is_quiet_until_it_jumps() -> None:
    loss = np.full((8, 100), 2.0)
    assert detect_numerics(loss) == []
    loss[:, 60] = 2.5
    (f,) = detect_numerics(loss)
    assert f.kind == "loss_spike" and f.first_step == 60 and not f.active


@pytest.mark.parametrize("steps", [0, 1, 5, 21])
def test_short_windows(steps: int) -> None:
    loss = np.full((4, steps), 2.0)
    assert detect_numerics(loss) == []
    if steps:
        loss[1, -1] = np.nan
        assert kinds(detect_numerics(loss)) == ["nan"]


def test_one_dimensional_input_and_json_safe_evidence() -> None:
    loss = np.full(100, 2.0)
    loss[80] = 4.0
    loss[90] = np.nan
    findings = detect_numerics(loss)
    assert sorted(kinds(findings)) == ["loss_spike", "nan"]
    for f in findings:
        json.dumps(f.evidence, allow_nan=False)


def test_timing_at_scale() -> None:
    rng = np.random.default_rng(0)
    loss = rng.normal(2.0, 0.1, (16_384, 200))
    grad = rng.normal(1.0, 0.1, (16_384, 200))
    detect_numerics(loss, grad)
    t0 = time.perf_counter()
    detect_numerics(loss, grad)
    print(f"\ndetect_numerics 16384x200: {1e3 * (time.perf_counter() - t0):.1f} ms")

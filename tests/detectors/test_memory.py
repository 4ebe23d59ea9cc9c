"""Memory pressure: near-full and leaking ranks, on synthetic peaks with known answers."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from detectors.memory import MemoryConfig, detect_memory

GIB = float(1 << 30)
MIB = float(1 << 20)
R, S = 32, 200
CAP = 80 * GIB


def peaks(seed: int = 0, level_gib: float = 50.0, noise_gib: float = 0.5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return level_gib * GIB + rng.normal(0, noise_gib * GIB, (R, S))


@pytest.mark.parametrize("seed", range(10))
def test_flat_noisy_memory_produces_nothing(seed: int) -> None:
    assert detect_memory(peaks(seed, level_gib=60, noise_gib=3), CAP) == []
    assert detect_memory(peaks(seed, level_gib=70, noise_gib=1), CAP) == []


def test_leaking_rank_is_found_with_slope_and_time_to_full() -> None:
    used = peaks(1)
    used[7] += np.arange(S) * 50 * MIB  # 50 MiB per step: ~59.8 GiB now, full in ~400 steps
    steps = np.arange(S) + 1000

    (f,) = detect_memory(used, CAP, steps=steps)

    assert (f.kind, f.key, f.severity, f.ranks) == (
        "memory_pressure",
        "memory_pressure",
        "warning",
        (7,),
    )
    assert f.active and f.last_step == 1199
    ev = f.evidence
    assert ev["worst_rank"] == 7 and ev["ranks_filling"] == 1
    assert ev["slope_mib_per_step"] == pytest.approx(50, rel=0.15)
    assert ev["current_gib"] == pytest.approx(50 + 199 * 50 / 1024, abs=0.5)
    assert ev["steps_to_capacity"] == pytest.approx(415, rel=0.2)
    assert ev["projected_full_step"] == 1199 + ev["steps_to_capacity"]
    assert "rank 7" in f.summary and "MiB/step" in f.summary and "\n" not in f.summary
    json.dumps(ev, allow_nan=False)


def test_leak_beyond_the_horizon_is_not_reported() -> None:
    used = peaks(2)
    used[3] = 50 * GIB + np.arange(S) * 5 * MIB  # 5 MiB per step: ~5,000 steps to full
    assert detect_memory(used, CAP) == []
    assert detect_memory(used, CAP, config=MemoryConfig(horizon_steps=10_000))[0].ranks == (3,)


def test_every_rank_leaking_is_one_finding() -> None:
    used = np.full((R, S), 50 * GIB) + np.arange(S) * 100 * MIB
    (f,) = detect_memory(used, CAP)
    assert f.ranks == tuple(range(R)) and f.evidence["ranks_filling"] == R


def test_near_capacity_and_flat_is_a_warning() -> None:
    used = peaks(3)
    used[4] = 77 * GIB  # 96%
    (f,) = detect_memory(used, CAP)
    assert f.ranks == (4,) and f.severity == "warning"
    assert f.evidence["usage_pct"] == pytest.approx(96.2, abs=0.1)
    assert "steps_to_capacity" not in f.evidence


def test_filling_within_critical_steps_is_critical() -> None:
    used = peaks(4)
    used[9] = np.linspace(60, 78.5, S) * GIB  # ~95 MiB per step, 1.5 GiB left
    (f,) = detect_memory(used, CAP)
    assert f.ranks == (9,) and f.severity == "critical"
    assert f.evidence["steps_to_capacity"] <= 50


def test_stair_step_growth_is_a_leak() -> None:
    used = peaks(5)
    used[11] += (np.arange(S) // 20) * 1.5 * GIB  # allocator blocks: +1.5 GiB every 20 steps
    (f,) = detect_memory(used, CAP)
    assert f.ranks == (11,)
    assert f.evidence["slope_mib_per_step"] == pytest.approx(1.5 * 1024 / 20, rel=0.25)


def test_a_single_spike_or_falling_memory_is_no_pressure() -> None:
    used = peaks(6)
    used[2, -1] = 79 * GIB  # one odd step
    used[5] -= np.arange(S) * 50 * MIB  # shrinking
    assert detect_memory(used, CAP) == []


def test_per_rank_capacity_and_unusable_capacities() -> None:
    used = peaks(7)
    cap = np.full(R, CAP)
    cap[0] = 52 * GIB  # a smaller device: rank 0 is at ~96%
    cap[1] = 0.0  # unknown capacity: skipped
    cap[2] = np.nan
    (f,) = detect_memory(used, cap)
    assert f.ranks == (0,)


def test_missing_values() -> None:
    used = peaks(8)
    used[:, 180] = np.nan  # a step nobody reported
    used[6] = np.nan  # a rank that never reported
    used[7] += np.arange(S) * 50 * MIB
    used[7, -3:] = np.nan  # the leaking rank missed its last reports
    (f,) = detect_memory(used, CAP)
    assert f.ranks == (7,)
    assert f.evidence["slope_mib_per_step"] == pytest.approx(50, rel=0.2)


def test_constant_series() -> None:
    assert detect_memory(np.full((R, S), 40 * GIB), CAP) == []
    (f,) = detect_memory(np.full((R, S), 80 * GIB), CAP)  # exactly full
    assert f.severity == "critical" and len(f.ranks) == R


@pytest.mark.parametrize("steps", [0, 1, 3, 9])
def test_short_windows(steps: int) -> None:
    used = np.full((4, steps), 50 * GIB) + np.arange(steps) * GIB
    assert detect_memory(used, CAP) == []  # too short for a trend
    if steps:
        used[2] = 79 * GIB
        (f,) = detect_memory(used, CAP)
        assert f.ranks == (2,)


def test_one_rank_as_a_vector() -> None:
    (f,) = detect_memory(np.linspace(60, 70, 100) * GIB, CAP)  # ~100 steps to full
    assert f.ranks == (0,) and f.severity == "warning"
    assert f.evidence["steps_to_capacity"] == pytest.approx(99, abs=1)


def test_timing_at_scale() -> None:
    rng = np.random.default_rng(0)
    used = 50 * GIB + rng.normal(0, 0.5 * GIB, (16_384, 200))
    detect_memory(used, CAP)
    t0 = time.perf_counter()
    detect_memory(used, CAP)
    healthy = time.perf_counter() - t0
    used += np.arange(200) * 100 * MIB
    t0 = time.perf_counter()
    detect_memory(used, CAP)
    leaking = time.perf_counter() - t0
    print(
        f"\ndetect_memory 16384x200: {1e3 * healthy:.1f} ms healthy, "
        f"{1e3 * leaking:.1f} ms with every rank leaking"
    )

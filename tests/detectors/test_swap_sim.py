"""The swap simulator against tiny cases computed by hand.

The chain: ops 0, 1, 2 forward, 3, 4, 5 backward, 1 s each; op k saves storage k (100 bytes),
op 5 - k consumes and frees it; 10 bytes of parameters. Nothing offloaded, the peak is during
op 2: 10 + 3 * 100.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from detectors.swap import SimResult, baselines, simulate
from tests.detectors.swap_profiles import chain_profile

INF = math.inf


def policy(
    *offload: tuple[int, int], recompute: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "version": 1,
        "fingerprint": "f" * 32,
        "offload": [{"storage": s, "prefetch_at": at} for s, at in offload],
        "recompute": recompute or [],
    }


def test_no_offload_peak_is_everything_saved_at_the_end_of_forward() -> None:
    r = simulate(chain_profile(3), None, bandwidth_bytes_per_s=100.0)
    assert r == SimResult(peak_bytes=310, exposed_s=0.0, step_s=6.0)


def test_fast_copy_hidden_behind_compute_lowers_the_peak() -> None:
    # 1000 B/s: storage 0 leaves at 1.1 s, so it is gone before op 2 starts (2 s); prefetched
    # before op 4 (its copy ends at 4.1 s, before op 5 needs it at 5 s). Op 2: 10 + s1 + s2.
    r = simulate(chain_profile(3), policy((0, 4)), bandwidth_bytes_per_s=1000.0)
    assert r == SimResult(peak_bytes=210, exposed_s=0.0, step_s=6.0)


def test_a_storage_counts_until_its_copy_out_completes() -> None:
    # 50 B/s: the copy of storage 0 takes 2 s (1 s → 3 s), so it is still there during op 2.
    r = simulate(chain_profile(3), policy((0, 3)), bandwidth_bytes_per_s=50.0)
    assert r == SimResult(peak_bytes=310, exposed_s=0.0, step_s=6.0)


def test_a_late_prefetch_stalls_the_consumer() -> None:
    # Prefetch of storage 0 issued before its consumer op 5 (at 5 s): copy 1 s, op 5 waits 1 s.
    r = simulate(chain_profile(3), policy((0, 5)), bandwidth_bytes_per_s=100.0)
    assert r == SimResult(peak_bytes=210, exposed_s=1.0, step_s=7.0)


def test_one_copy_engine_each_way_serialises_the_copies() -> None:
    # 150 bytes at 100 B/s: 1.5 s a copy. Out: s0 1.0→2.5 s, s1 queued 2.5→4.0 s. Both
    # prefetched before op 3, the one needed first first: s1 waits for its copy out (4.0 s),
    # 4.0→5.5 s; s0 5.5→7.0 s. Op 4 waits 1.5 s (5.5), op 5 (due 6.5) waits 0.5 s.
    # With two engines each way the stall would be 1.0 s. s1 is still being copied out when
    # its prefetch is issued, so it never leaves; op 2 holds all three: 10 + 3 * 150.
    r = simulate(chain_profile(3, nbytes=150), policy((0, 3), (1, 3)), bandwidth_bytes_per_s=100.0)
    assert r == SimResult(peak_bytes=460, exposed_s=2.0, step_s=8.0)


def test_infinite_bandwidth_is_the_synchronous_copy_model() -> None:
    # Each storage leaves right after it is packed and comes back at its own consumer.
    r = simulate(chain_profile(3), policy((0, 5), (1, 4), (2, 3)), bandwidth_bytes_per_s=INF)
    assert r == SimResult(peak_bytes=110, exposed_s=0.0, step_s=6.0)


def test_recompute_drops_the_storage_and_charges_its_cost() -> None:
    rec = [{"storage": 1, "bytes": 100, "at": 4, "cost_s": 0.5}]
    r = simulate(chain_profile(3), policy(recompute=rec), bandwidth_bytes_per_s=100.0)
    # op 2: 10 + s0 + s2 = 210; op 4: s1 rebuilt (s2 freed after op 3): 10 + s0 + s1 = 210.
    assert r == SimResult(peak_bytes=210, exposed_s=0.0, step_s=6.5, recompute_s=0.5)


def test_baselines_name_the_three_and_order_the_peaks() -> None:
    prof = chain_profile(4, nbytes=1000, dur=1.0)
    b = baselines(prof, 1e6)
    assert set(b) == {"no offload", "offload everything", "checkpoint every layer"}
    assert b["no offload"].peak_bytes == 10 + 4 * 1000
    # 1 ms copies: a storage leaves during the op after the one that saved it. Only the last
    # one, consumed by the first backward op, cannot be prefetched ahead: 2 ms exposed (its
    # copy out ends 1 ms into that op, then 1 ms back).
    assert b["offload everything"].peak_bytes == 10 + 2 * 1000
    assert b["offload everything"].exposed_s == pytest.approx(0.002)
    # Every layer is its own checkpoint here: only its first (and only) storage is kept.
    assert b["checkpoint every layer"].peak_bytes == b["no offload"].peak_bytes


def test_bad_profiles_are_refused_naming_the_field() -> None:
    prof = chain_profile(2)
    prof["saved"][0]["consumer"] = 99
    with pytest.raises(ValueError, match=r"saved\.0\.consumer"):
        simulate(prof, None, bandwidth_bytes_per_s=1.0)
    with pytest.raises(ValueError, match="bandwidth"):
        simulate(chain_profile(2), None, bandwidth_bytes_per_s=0.0)
    with pytest.raises(ValueError, match=r"offload\.0\.storage"):
        simulate(chain_profile(2), policy((7, 3)), bandwidth_bytes_per_s=1.0)

"""The swap-policy generator: within budget when it can be, honest when it cannot, and fast
enough for a sequence it has never seen (its time is measured in bench/swap_policy.py)."""

from __future__ import annotations

import json
import math

import pytest

from detectors.swap import baselines, generate, simulate
from tests.detectors.swap_profiles import chain_profile, random_profile

GIB = 1 << 30


def check_policy(prof: dict, pol: dict, bw: float) -> None:
    """What every policy must be: JSON, for this profile, its prediction the simulator's."""
    assert json.loads(json.dumps(pol)) == pol
    assert pol["fingerprint"] == prof["fingerprint"]
    sim = simulate(prof, pol, bandwidth_bytes_per_s=bw)
    assert pol["predicted_peak_bytes"] == sim.peak_bytes
    assert pol["predicted_exposed_s"] == sim.exposed_s
    assert pol["predicted_step_s"] == sim.step_s
    consumers = {s["consumer"] for s in prof["saved"]}
    by_storage = {s["storage"]: s for s in prof["saved"]}
    for e in pol["offload"]:
        s = by_storage[e["storage"]]
        assert not s["param"]
        assert e["bytes"] == s["bytes"]
        # A prefetch is issued on an unpack, before the consumer needs the data.
        assert e["prefetch_at"] in consumers
        assert s["producer"] < e["prefetch_at"] <= s["consumer"]


def test_a_budget_the_step_fits_in_offloads_nothing() -> None:
    prof = chain_profile(8, nbytes=1000)
    none = simulate(prof, None, bandwidth_bytes_per_s=1e4)
    pol = generate(prof, budget_bytes=none.peak_bytes, bandwidth_bytes_per_s=1e4, version=7)
    check_policy(prof, pol, 1e4)
    assert pol["version"] == 7 and pol["feasible"] is True
    assert pol["offload"] == [] and pol["recompute"] == []
    assert pol["predicted_exposed_s"] == none.exposed_s == 0.0
    assert pol["predicted_peak_bytes"] == none.peak_bytes


def test_a_tighter_budget_is_met_with_every_copy_hidden() -> None:
    # 8 layers of 1000 bytes, 1 s an op, 0.1 s a copy: half the activations can go.
    prof = chain_profile(8, nbytes=1000)
    budget = 10 + 4 * 1000
    pol = generate(prof, budget_bytes=budget, bandwidth_bytes_per_s=1e4)
    check_policy(prof, pol, 1e4)
    assert pol["feasible"] is True
    assert pol["predicted_peak_bytes"] <= budget
    assert pol["predicted_exposed_s"] == 0.0
    assert pol["predicted_step_s"] == prof["step_s"]
    # The longest idle (the earliest produced) go first.
    assert [e["storage"] for e in pol["offload"]] == list(range(len(pol["offload"])))
    assert pol["storage_bytes"] == [1000] * 8
    assert pol["consumers"] == [15 - k for k in range(8)]


def test_it_does_not_offload_more_than_the_budget_needs() -> None:
    prof = chain_profile(8, nbytes=1000)
    loose = generate(prof, budget_bytes=10 + 6 * 1000, bandwidth_bytes_per_s=1e4)
    tight = generate(prof, budget_bytes=10 + 3 * 1000, bandwidth_bytes_per_s=1e4)
    assert 0 < len(loose["offload"]) < len(tight["offload"])


def test_a_budget_below_what_must_stay_is_reported_infeasible() -> None:
    prof = chain_profile(8, nbytes=1000)
    b = baselines(prof, 1e4)
    budget = 10 + 500  # less than one activation: never possible
    pol = generate(prof, budget_bytes=budget, bandwidth_bytes_per_s=1e4)
    check_policy(prof, pol, 1e4)
    assert pol["feasible"] is False
    assert budget < pol["predicted_peak_bytes"] < b["no offload"].peak_bytes
    # The best it reached is as low as offloading everything gets.
    assert pol["predicted_peak_bytes"] <= b["offload everything"].peak_bytes


def test_slow_copies_that_cannot_hide_are_exposed_not_hidden() -> None:
    # 1000 bytes at 100 B/s: 10 s a copy, ops of 1 s. Meeting the budget costs waiting.
    prof = chain_profile(8, nbytes=1000)
    pol = generate(prof, budget_bytes=10 + 5 * 1000, bandwidth_bytes_per_s=100.0)
    check_policy(prof, pol, 100.0)
    if pol["feasible"]:
        assert pol["predicted_exposed_s"] > 0
        assert pol["predicted_step_s"] > prof["step_s"]


def test_views_of_one_storage_are_offloaded_once() -> None:
    prof = chain_profile(4, nbytes=1000)
    q = dict(prof["saved"][0])
    prof["saved"].insert(1, {**q, "id": 1, "shape": [8], "consumer": 6, "last_use": 7})
    for k, s in enumerate(prof["saved"]):
        s["id"] = k
    pol = generate(prof, budget_bytes=10 + 2 * 1000, bandwidth_bytes_per_s=1e4)
    check_policy(prof, pol, 1e4)
    assert [e["storage"] for e in pol["offload"]].count(0) <= 1
    # The storage is needed back by its first consumer (op 6), not the other view's (7).
    for e in pol["offload"]:
        if e["storage"] == 0:
            assert e["prefetch_at"] <= 6


@pytest.mark.parametrize("frac", [0.9, 0.6, 0.3])
def test_a_ten_thousand_op_sequence_never_seen(frac: float) -> None:
    prof = random_profile(10_000, seed=int(frac * 10))
    bw = 12e9  # PCIe 4 x16, about
    none = simulate(prof, None, bandwidth_bytes_per_s=bw)
    base = prof["param_bytes"] + prof["grad_bytes"] + prof["optimizer_bytes"]
    budget = int(base + frac * (none.peak_bytes - base))
    pol = generate(prof, budget_bytes=budget, bandwidth_bytes_per_s=bw)
    check_policy(prof, pol, bw)
    assert len(pol["storage_bytes"]) == 1 + max(s["storage"] for s in prof["saved"])
    every = baselines(prof, bw)["offload everything"]
    if every.peak_bytes <= budget:  # it can be done: it is done, hiding no worse than that
        assert pol["feasible"] is True
        assert pol["predicted_peak_bytes"] <= budget
        assert pol["predicted_exposed_s"] <= every.exposed_s + 1e-12
    else:
        assert pol["feasible"] is False


def test_bad_arguments_are_refused_by_name() -> None:
    prof = chain_profile(2)
    with pytest.raises(ValueError, match="budget_bytes"):
        generate(prof, budget_bytes=-1, bandwidth_bytes_per_s=1.0)
    with pytest.raises(ValueError, match="bandwidth"):
        generate(prof, budget_bytes=1, bandwidth_bytes_per_s=math.nan)
    with pytest.raises(ValueError, match="ops"):
        generate({"ops": [], "saved": []}, budget_bytes=1, bandwidth_bytes_per_s=1.0)

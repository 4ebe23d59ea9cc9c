"""The swap executor on a real GPT-style model (CPU): bit-identical gradients, q/k/v views
offloaded as one storage, foreign policies skipped, the simulator's peak measured, policies
switched only at step boundaries. The same on CUDA where there is one."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from collector.integrations.profile import capture_profile
from collector.integrations.swap import SwapExecutor
from detectors.swap import generate, offload_everything, simulate
from tests.collector.tiny_models import TinyGPT, batch

INF = math.inf


def model_and_step(seq: int, device: str = "cpu") -> tuple[nn.Module, Callable[[], None]]:
    torch.manual_seed(0)
    model = TinyGPT(dim=32, layers=2).to(device)
    tokens = batch(seq).to(device)

    def step() -> None:
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()

    return model, step


def grads(model: nn.Module, step: Callable[[], None], executor: SwapExecutor | None) -> list:
    model.zero_grad(set_to_none=True)
    if executor is None:
        step()
    else:
        with executor.step():
            step()
    return [p.grad.clone() for p in model.parameters()]


def profile_of(model: nn.Module, step: Callable[[], None]) -> dict[str, Any]:
    model.zero_grad(set_to_none=True)
    return capture_profile(step, module=model)


def assert_identical(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


def test_offloading_everything_leaves_gradients_bit_identical() -> None:
    model, step = model_and_step(seq=12)
    plain = grads(model, step, None)
    prof = profile_of(model, step)
    policy = offload_everything(prof, bandwidth_bytes_per_s=1e9)
    # q, k and v are views of one projection: several saved tensors share one storage.
    per_storage: dict[int, int] = {}
    for s in prof["saved"]:
        per_storage[s["storage"]] = per_storage.get(s["storage"], 0) + 1
    shared = {k for k, n in per_storage.items() if n >= 2}
    offloaded = {e["storage"] for e in policy["offload"]}
    assert shared & offloaded, "no storage with several views was offloaded"

    ex = SwapExecutor()
    ex.set_policy(policy)
    swapped = grads(model, step, ex)
    assert_identical(plain, swapped)
    report = ex.last
    assert report is not None
    assert report["skipped"] is False and report["failed"] is False
    assert report["policy_version"] == policy["version"]
    # Each storage went out once, however many of its views were saved.
    assert report["offloaded"] == len(policy["offload"])
    assert report["offloaded_bytes"] == sum(e["bytes"] for e in policy["offload"])
    assert ex.counts["applied"] == 1


def test_a_policy_for_other_sizes_is_skipped_and_gradients_stay_identical() -> None:
    model, step = model_and_step(seq=12)
    policy = offload_everything(profile_of(model, step), bandwidth_bytes_per_s=1e9)
    other, other_step = model_and_step(seq=20)  # another sequence length: other storages
    plain = grads(other, other_step, None)
    ex = SwapExecutor()
    ex.set_policy(policy)
    swapped = grads(other, other_step, ex)
    assert_identical(plain, swapped)
    assert ex.last is not None and ex.last["skipped"] is True
    assert ex.counts["skipped"] == 1 and ex.counts["applied"] == 0


@pytest.mark.parametrize("budget_frac", [1.0, 0.7, 0.4, 0.0])
def test_measured_peak_on_cpu_is_the_simulators_prediction(budget_frac: float) -> None:
    model, step = model_and_step(seq=16)
    prof = profile_of(model, step)
    none = simulate(prof, None, bandwidth_bytes_per_s=INF).peak_bytes
    base = prof["param_bytes"] + prof["grad_bytes"] + prof["optimizer_bytes"]
    budget = int(base + budget_frac * (none - base))
    # Prefetch points from a finite bandwidth (some come before their consumer); on CPU the
    # copies are synchronous, which the simulator models as infinite bandwidth.
    policy = generate(prof, budget_bytes=budget, bandwidth_bytes_per_s=2e8)
    predicted = simulate(prof, policy, bandwidth_bytes_per_s=INF).peak_bytes
    ex = SwapExecutor()
    ex.set_policy(policy)
    grads(model, step, ex)
    assert ex.last is not None and ex.last["skipped"] is False
    assert ex.last["peak_bytes"] == predicted
    if budget_frac < 1.0:
        assert policy["offload"] and predicted < none


def test_a_new_policy_applies_from_the_next_step_only() -> None:
    model, step = model_and_step(seq=12)
    prof = profile_of(model, step)
    first = offload_everything(prof, bandwidth_bytes_per_s=1e9, version=1)
    second = generate(prof, budget_bytes=10**12, bandwidth_bytes_per_s=1e9, version=2)
    ex = SwapExecutor()
    ex.set_policy(first)
    versions = []
    for i in range(3):
        model.zero_grad(set_to_none=True)
        with ex.step(i):
            step()
            if i == 1:
                ex.set_policy(second)  # mid-step: this step keeps the first
        assert ex.last is not None
        versions.append((ex.last["policy_version"], ex.last["offloaded"]))
    assert versions == [(1, len(first["offload"])), (1, len(first["offload"])), (2, 0)]
    ex.set_policy(None)
    with ex.step(3):
        step()
    assert ex.last is not None and ex.last["policy_version"] is None


def test_a_policy_that_cannot_be_read_is_refused_and_the_old_one_stays() -> None:
    model, step = model_and_step(seq=12)
    policy = offload_everything(profile_of(model, step), bandwidth_bytes_per_s=1e9)
    ex = SwapExecutor()
    assert ex.set_policy(policy) is True
    assert ex.set_policy({"version": 9, "storage_bytes": "nope"}) is False
    assert ex.counts["rejected"] == 1
    grads(model, step, ex)
    assert ex.last is not None and ex.last["policy_version"] == policy["version"]


def test_the_users_own_saved_tensor_hooks_win() -> None:
    model, step = model_and_step(seq=12)
    policy = offload_everything(profile_of(model, step), bandwidth_bytes_per_s=1e9)
    plain = grads(model, step, None)
    ex = SwapExecutor()
    ex.set_policy(policy)
    with torch.autograd.graph.save_on_cpu():
        swapped = grads(model, step, ex)
    assert_identical(plain, swapped)
    assert ex.counts["skipped"] == 1 and ex.counts["applied"] == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_on_cuda_gradients_are_identical_and_the_allocator_peak_drops() -> None:
    model, step = model_and_step(seq=64, device="cuda")
    plain = grads(model, step, None)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    grads(model, step, None)
    torch.cuda.synchronize()
    bare_peak = torch.cuda.max_memory_allocated()
    prof = profile_of(model, step)
    policy = offload_everything(prof, bandwidth_bytes_per_s=1.2e10)
    ex = SwapExecutor()
    ex.set_policy(policy)
    swapped = grads(model, step, ex)
    torch.cuda.synchronize()
    assert_identical(plain, swapped)
    assert ex.last is not None and ex.last["skipped"] is False
    assert ex.last["cuda_peak_bytes"] <= bare_peak

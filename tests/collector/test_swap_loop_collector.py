"""The collector's half of the swap loop (issue 14): ``VIGIL_SWAP=1`` runs a SwapExecutor as
a step listener, ``apply_swap_policy`` actions switch policies at step boundaries, step
records carry ``swap_policy``/``swap_peak_bytes`` and the executor's ``mem_bytes`` on CPU,
heartbeats carry ``mem_capacity`` and ``swap``, the op-sequence capture's steps run without
the executor. Real torch, a real GPT-style model; actions round-trip through a real
``vigil server``."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import torch
from torch import nn

import collector as vigil
from collector.config import Config
from collector.integrations import opseq, swap_loop
from collector.integrations.profile import capture_profile
from detectors.swap import generate, offload_everything, simulate
from tests.collector.dist_jobs import make_client
from tests.collector.test_actions import wait_for_state
from tests.collector.tiny_models import TinyGPT, batch
from tests.conftest import ADMIN
from tests.servers import live_server

INF = math.inf


class Job:
    """A tiny GPT with AdamW: ``run(n)`` is one training step at the current length."""

    def __init__(self, seq: int = 16) -> None:
        torch.manual_seed(0)
        self.model = TinyGPT(dim=32, layers=2)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.seq = seq
        self.grads: list[list[torch.Tensor]] = []

    def train(self) -> None:
        tokens = batch(self.seq)
        logits = self.model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.grads.append([p.grad.clone() for p in self.model.parameters()])  # type: ignore[union-attr]
        self.opt.step()

    def run(self, n: int) -> None:
        with vigil.step(n):
            self.train()

    def profile(self) -> dict[str, Any]:
        """A profile of one step on a copy (the job's weights stay as they are)."""
        twin = Job(self.seq)
        twin.model.load_state_dict(self.model.state_dict())
        twin.train()  # the optimizer's state exists, as in the job
        return capture_profile(twin.train, module=twin.model, optimizer=twin.opt)


def steps_of(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {e["step"]: e for e in events if e["type"] == "step"}


def unit_client(**config: Any) -> tuple[Any, list[dict[str, Any]], swap_loop.SwapLoop]:
    """A client with the op-sequence listener and then the swap loop, events in a list."""
    client, events = make_client(swap=True, **config)
    opseq.setup_once(client)
    loop = swap_loop.setup_once(client)
    assert loop is not None
    return client, events, loop


def apply_async(loop: swap_loop.SwapLoop, params: dict[str, Any]) -> dict[str, Any]:
    """Run the handler on a thread, as the action runner does; ``out`` fills when it ends."""
    out: dict[str, Any] = {}

    def handler() -> None:
        try:
            out["result"] = loop.apply_swap_policy(params)
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=handler, daemon=True)
    thread.start()
    out["thread"] = thread
    deadline = time.monotonic() + 5
    while not loop.cache and "error" not in out and time.monotonic() < deadline:
        time.sleep(0.005)
    return out


# -- configuration and heartbeats -------------------------------------------------------


def test_swap_and_memory_budget_come_from_the_environment() -> None:
    cfg = Config.resolve(environ={"VIGIL_SWAP": "1", "VIGIL_MEMORY_BUDGET_BYTES": "8.5e6"})
    assert (cfg.swap, cfg.memory_budget_bytes) == (True, 8_500_000)
    assert Config.resolve(environ={"VIGIL_SWAP": "true"}).swap is True
    off = Config.resolve(environ={"VIGIL_SWAP": "0", "VIGIL_MEMORY_BUDGET_BYTES": "-3"})
    assert (off.swap, off.memory_budget_bytes) == (False, None)
    bad = Config.resolve(environ={"VIGIL_SWAP": "maybe", "VIGIL_MEMORY_BUDGET_BYTES": "inf"})
    assert (bad.swap, bad.memory_budget_bytes) == (False, None)
    assert Config.resolve(swap=True, memory_budget_bytes=5, environ={}).swap is True


def test_heartbeats_carry_mem_capacity_and_swap() -> None:
    client, _, _ = unit_client(memory_budget_bytes=123_456_789)
    [beat] = client._tick()
    assert beat["mem_capacity"] == 123_456_789 and beat["swap"] is True
    plain, _ = make_client()
    [beat] = plain._tick()
    assert beat["swap"] is False and "mem_capacity" not in beat  # CPU, no budget


def test_without_swap_there_is_no_executor_and_no_handler() -> None:
    client, events = make_client()
    assert swap_loop.setup_once(client) is None
    assert "apply_swap_policy" not in client.actions.handlers
    job = Job()
    for n in range(2):
        job.run(n)
    client.flush()
    assert not {"swap_policy", "swap_peak_bytes"} & set(steps_of(events)[1])


# -- steps --------------------------------------------------------------------------------


def test_every_cpu_step_is_accounted_as_the_simulator_models_it() -> None:
    client, events, loop = unit_client(opseq_every=0)
    job = Job()
    for n in range(3):
        job.run(n)
    client.flush()
    step = steps_of(events)[2]
    predicted = simulate(job.profile(), None, bandwidth_bytes_per_s=INF).peak_bytes
    assert step["mem_bytes"] == step["swap_peak_bytes"] == predicted
    assert "swap_policy" not in step
    assert loop.executor.counts["accounted"] == 3


class Scaled(nn.Module):
    """A buffer sliced and saved for backward (as a causal mask can be): not activations."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.lin(x) * self.scale[: x.shape[-1]]).tanh()


def test_buffers_saved_for_backward_are_not_counted_once_a_capture_saw_them() -> None:
    client, events, _ = unit_client(opseq_every=3)
    torch.manual_seed(0)
    model = Scaled()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(16, 8)

    def train() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).sum().backward()
        opt.step()

    for n in range(3):
        with vigil.step(n):
            train()
    client.flush()
    steps = steps_of(events)
    assert steps[0]["mem_bytes"] is None  # captured: the executor stood aside
    expected = simulate(
        capture_profile(train, module=model, optimizer=opt), None, bandwidth_bytes_per_s=INF
    ).peak_bytes
    assert steps[1]["mem_bytes"] == steps[2]["mem_bytes"] == expected


def test_a_policy_received_mid_step_applies_from_the_next_step() -> None:
    client, events, loop = unit_client(opseq_every=0)
    job = Job()
    for n in range(3):
        job.run(n)
    prof = job.profile()
    base = prof["param_bytes"] + prof["grad_bytes"] + prof["optimizer_bytes"]
    none = simulate(prof, None, bandwidth_bytes_per_s=INF).peak_bytes
    policy = generate(prof, budget_bytes=(base + none) // 2, bandwidth_bytes_per_s=2e8, version=4)
    assert policy["offload"]
    with vigil.step(3):
        out = apply_async(loop, {"policy": policy, "shape_fp": loop.last_shape})
        job.train()
    for n in range(4, 6):
        job.run(n)
    out["thread"].join(5)
    client.flush()
    steps = steps_of(events)
    assert out["result"] == {
        "applied": True,
        "version": 4,
        "from_step": 4,
        "shape_fp": loop.last_shape,
        "peak_bytes": simulate(prof, policy, bandwidth_bytes_per_s=INF).peak_bytes,
        "offloaded": len(policy["offload"]),
    }
    assert "swap_policy" not in steps[3] and steps[3]["mem_bytes"] == none
    for n in (4, 5):
        assert steps[n]["swap_policy"] == 4
        assert steps[n]["mem_bytes"] == steps[n]["swap_peak_bytes"] == out["result"]["peak_bytes"]
        assert steps[n]["mem_bytes"] < none


def test_gradients_are_bit_identical_with_and_without_the_policy() -> None:
    plain = Job()
    for _ in range(6):
        plain.train()
    client, events, loop = unit_client(opseq_every=0)
    job = Job()
    job.run(0)
    policy = offload_everything(job.profile(), bandwidth_bytes_per_s=1e9)
    out = apply_async(loop, {"policy": policy, "shape_fp": loop.last_shape})
    for n in range(1, 6):
        job.run(n)
    client.flush()
    assert out["result"]["from_step"] == 1
    assert [steps_of(events)[n].get("swap_policy") for n in range(6)] == [None] + [1] * 5
    for a, b in zip(plain.grads, job.grads, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    for x, y in zip(plain.model.parameters(), job.model.parameters(), strict=True):
        assert torch.equal(x, y)


def test_a_capture_step_during_a_policy_stands_aside() -> None:
    """Sampled captures (every 4th step) while a policy is in force: the capture step runs
    without the executor, so its gradients and its profile are those of the plain step."""
    client, events, loop = unit_client(opseq_every=4)
    plain = Job()
    job = Job()
    for n in range(2):
        plain.train()
        job.run(n)
    policy = offload_everything(job.profile(), bandwidth_bytes_per_s=1e9)
    out = apply_async(loop, {"policy": policy, "shape_fp": loop.last_shape})
    for n in range(2, 4):
        plain.train()
        job.run(n)
    assert out["result"]["from_step"] == 2
    reference = job.profile()  # what step 4 must see: the same weights, no executor
    plain.train()
    listener = loop.opseq
    with vigil.step(4):
        capture = listener.capture
        job.train()
    assert capture is not None and capture.ok
    captured = capture.profile(reference["fingerprint"])
    for n in range(5, 7):
        plain.train()
        job.run(n)
    client.flush()
    steps = steps_of(events)
    assert "swap_policy" not in steps[4] and steps[4]["mem_bytes"] is None
    assert steps[4]["opseq"] == reference["fingerprint"]
    assert captured["saved_complete"] and captured["saved"] == reference["saved"]
    assert [steps[n].get("swap_policy") for n in (2, 3, 5, 6)] == [1] * 4
    for a, b in zip(plain.grads, job.grads, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_policy_that_does_not_fit_its_shape_is_dropped_and_its_action_fails() -> None:
    client, events, loop = unit_client(opseq_every=0)
    other = Job(seq=24)
    policy = offload_everything(other.profile(), bandwidth_bytes_per_s=1e9)
    job = Job()
    job.run(0)
    out = apply_async(loop, {"policy": policy, "shape_fp": loop.last_shape})
    for n in range(1, 3):
        job.run(n)
    out["thread"].join(5)
    assert "do not match the steps of shape" in out["error"], out
    assert not loop.cache and loop.executor.counts["skipped"] == 1
    client.flush()
    assert [steps_of(events)[n].get("swap_policy") for n in range(3)] == [None] * 3
    plain = Job()
    for _ in range(3):
        plain.train()
    for a, b in zip(plain.grads, job.grads, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_newer_policy_for_the_same_shape_supersedes_one_not_yet_run() -> None:
    _, _, loop = unit_client(opseq_every=0)
    job = Job()
    job.run(0)
    prof = job.profile()
    first = apply_async(loop, {"policy": offload_everything(prof, bandwidth_bytes_per_s=1e9)})
    second_policy = offload_everything(prof, bandwidth_bytes_per_s=1e9, version=2)
    second = apply_async(loop, {"policy": second_policy})
    first["thread"].join(5)
    assert "superseded by policy v2" in first["error"]
    job.run(1)
    second["thread"].join(5)
    assert second["result"]["version"] == 2 and second["result"]["from_step"] == 1
    assert len(loop.cache) == 1


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "a policy must be a dict, not NoneType"),
        ({"policy": {"version": 2}}, "the policy has no 'storage_bytes'"),
        ({"policy": {"storage_bytes": [4], "consumers": []}}, "differ in length"),
        ({"policy": {"storage_bytes": [4], "consumers": [1]}, "shape_fp": 5}, "shape_fp must"),
    ],
)
def test_a_malformed_policy_is_refused_by_the_handler(params, message) -> None:  # type: ignore[no-untyped-def]
    _, _, loop = unit_client(opseq_every=0)
    with pytest.raises(ValueError, match=message):
        loop.apply_swap_policy(params)
    assert not loop.cache


# -- round trips through a real server --------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with live_server(f"sqlite:///{tmp_path_factory.mktemp('db') / 'vigil.db'}") as base:
        yield base


def start(base: str, job: str, **options: Any) -> list[dict[str, Any]]:
    """``vigil.init(swap=True)`` against ``base``; returns the events it sends, as sent."""
    assert vigil.init(
        job=job, endpoint=base, token="vigil-dev-ingest", heartbeat_s=0.1, flush_s=0.1,
        swap=True, **options,
    )  # fmt: skip
    client = vigil.get_client()
    assert client is not None
    sent: list[dict[str, Any]] = []
    submit = client.worker.submit

    def tee(event: dict[str, Any]) -> None:
        sent.append(event)
        submit(event)

    client.worker.submit = tee  # type: ignore[method-assign]
    tick = client.worker._tick

    def beats() -> list[dict[str, Any]]:
        out = tick()
        sent.extend(out)
        return out

    client.worker._tick = beats
    return sent


def trigger(base: str, job: str, params: dict[str, Any]) -> int:
    reply = httpx.post(
        f"{base}/api/v1/jobs/{job}/actions",
        json={"kind": "apply_swap_policy", "params": params},
        headers=ADMIN,
    )
    assert reply.status_code == 201, reply.text
    return int(reply.json()["id"])


def train_until(job: Job, first: int, done: Callable[[], bool], timeout: float = 20) -> int:
    """Train from step ``first`` until ``done()``; returns the next step number."""
    n, deadline = first, time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out"
        job.run(n)
        n += 1
        time.sleep(0.01)
    return n


def test_apply_swap_policy_round_trip_through_the_server(server: str) -> None:
    sent = start(server, "swap-round-trip", memory_budget_bytes=400_000, opseq_every=0)
    job = Job()
    for n in range(3):
        job.run(n)
    assert vigil.flush(timeout=10)
    loop = swap_loop.setup_once(vigil.get_client())  # type: ignore[arg-type]
    assert loop is not None
    policy = offload_everything(job.profile(), bandwidth_bytes_per_s=1e9, version=3)
    action = trigger(server, "swap-round-trip", {"policy": policy, "shape_fp": loop.last_shape})
    state: dict[str, Any] = {}

    def finished() -> bool:
        state.update(httpx.get(f"{server}/api/v1/actions/{action}", headers=ADMIN).json())
        return state["state"] in ("succeeded", "failed")

    end = train_until(job, 3, finished)
    assert state["state"] == "succeeded", state
    result = state["result"]["0"]
    assert result["applied"] is True and result["version"] == 3
    assert vigil.flush(timeout=10)
    steps = steps_of(sent)
    start_step = result["from_step"]
    assert 3 <= start_step < end
    assert all("swap_policy" not in steps[n] for n in range(start_step))
    assert all(steps[n]["swap_policy"] == 3 for n in range(start_step, end))
    beats = [e for e in sent if e["type"] == "heartbeat"]
    assert beats and all(b["mem_capacity"] == 400_000 and b["swap"] is True for b in beats)
    assert vigil.stats()["dropped"] == {}  # the server took every step and heartbeat


def test_a_malformed_policy_fails_the_action_and_the_job_runs_on(server: str) -> None:
    start(server, "swap-bad-policy", opseq_every=0)
    job = Job()
    job.run(0)
    assert vigil.flush(timeout=10)
    action = trigger(server, "swap-bad-policy", {"policy": {"version": 2}, "shape_fp": "x"})
    n = train_until(
        job, 1, lambda: wait_for_state(server, action, {"failed", "succeeded"}, 0)["state"]
        in ("failed", "succeeded"),
    )  # fmt: skip
    done = wait_for_state(server, action, {"failed"}, 5)
    assert done["state"] == "failed"
    assert done["result"]["0"]["error"] == "ValueError: the policy has no 'storage_bytes'"
    job.run(n)  # the job runs on
    assert len(job.grads) == n + 1


def test_init_again_with_the_same_settings_keeps_the_client(server: str) -> None:
    """``vigil run`` initialises the collector in each rank and the example script calls
    ``vigil.init()`` again: the rank must not say goodbye (``exiting``) and go on training."""
    sent = start(server, "swap-reinit", opseq_every=0)
    client = vigil.get_client()
    options = {"heartbeat_s": 0.1, "flush_s": 0.1, "swap": True, "opseq_every": 0}
    assert vigil.init(job="swap-reinit", endpoint=server, token="vigil-dev-ingest", **options)
    assert vigil.get_client() is client
    assert vigil.flush(timeout=10)
    assert not [e for e in sent if e.get("exiting")]
    assert vigil.init(job="swap-reinit-2", endpoint=server, token="vigil-dev-ingest", **options)
    assert vigil.get_client() is not client  # other settings: a new client, the old one left
    assert [e for e in sent if e.get("exiting")]

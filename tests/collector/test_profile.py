"""Profile on change (issue 14, item 1): one step in detail, real torch, real autograd."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import collector
from collector.integrations import opseq
from collector.integrations import profile as profile_module
from collector.integrations.profile import ProfileCapture, capture_profile
from tests.collector.dist_jobs import make_client
from tests.collector.tiny_models import TinyGPT, batch, gpt, train_step
from tests.conftest import INGEST
from tests.factories import batch as ingest_batch

SEQ, SIZE, DIM = 12, 4, 16


@pytest.fixture
def profiled() -> tuple[dict[str, Any], TinyGPT, torch.optim.Optimizer]:
    model, opt = gpt()
    tokens = batch(SEQ, SIZE)
    profile = capture_profile(lambda: train_step(model, opt, tokens), module=model, optimizer=opt)
    return profile, model, opt


def nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_forward_ops_in_order_with_module_paths_then_backward(profiled):
    profile, _, _ = profiled
    assert profile["version"] == 1 and profile["device"] == "cpu"
    assert len(profile["fingerprint"]) == 32 and len(profile["structure"]) == 16
    ops = profile["ops"]
    assert [op["i"] for op in ops] == list(range(len(ops)))
    phases = [op["phase"] for op in ops]
    first_backward = phases.index("backward")
    for op in ops[:first_backward]:  # zero_grad's record_function marks are not compute
        assert op["phase"] == ("other" if op["name"].startswith("profiler::") else "forward")
    assert "forward" not in phases[first_backward:]
    assert phases[-1] == "other"  # Adam's update runs outside autograd, grad mode off
    forward_modules = {op["module"] for op in ops[:first_backward]}
    assert {"tok", "blocks.0.attn.qkv", "blocks.1.mlp.1", "head"} <= forward_modules
    assert any(
        op["module"] == "blocks.0.attn.qkv" and op["name"] in ("aten::addmm", "aten::mm")
        for op in ops
    )
    starts = [op["start_s"] for op in ops]
    assert starts == sorted(starts) and all(op["duration_s"] >= 0 for op in ops)
    assert profile["step_s"] >= starts[-1]


def test_profile_fingerprint_is_the_step_records_fingerprint():
    model, opt = gpt()
    tokens = batch(SEQ, SIZE)
    profile = capture_profile(lambda: train_step(model, opt, tokens))
    client, events = make_client(opseq_every=1)
    opseq.setup_once(client)
    model, opt = gpt()  # a first step again: Adam makes its state on the first
    with collector.step(0):
        train_step(model, opt, tokens)
    client.flush()
    [step] = [e for e in events if e["type"] == "step"]
    assert step["opseq"] == profile["fingerprint"]


def test_every_saved_tensor_is_made_in_forward_and_unpacked_in_backward(profiled):
    profile, _, _ = profiled
    model, opt = gpt()  # the same step again, counting packs with the user's own hooks
    packs = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        packs.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        train_step(model, opt, batch(SEQ, SIZE))
    saved, ops = profile["saved"], profile["ops"]
    assert profile["saved_complete"] and [tuple(s["shape"]) for s in saved] == packs
    for s in saved:
        assert ops[s["producer"]]["phase"] == "forward", s
        assert ops[s["consumer"]]["phase"] == "backward", s
        assert s["producer"] < s["consumer"] <= s["last_use"], s
    # The token ids are saved by the embedding and unpacked by its backward; the first
    # LayerNorm's input (the embedding's output) by the LayerNorm and its backward.
    by_producer: dict[str, list[dict[str, Any]]] = {}
    for s in saved:
        by_producer.setdefault(ops[s["producer"]]["name"], []).append(s)
    ids = by_producer["aten::embedding"][0]
    assert (ids["shape"], ids["dtype"]) == ([SIZE, SEQ], "int64")
    assert ops[ids["consumer"]]["name"] == "aten::embedding_dense_backward"
    ln = [s for s in by_producer["aten::native_layer_norm"] if s["shape"] == [SIZE, SEQ, DIM]]
    assert ops[ln[0]["producer"]]["module"] == "blocks.0.ln"
    assert ops[ln[0]["consumer"]]["name"] == "aten::native_layer_norm_backward"
    # Storage ids are numbered in order of first pack, and one storage has one size.
    first: dict[int, int] = {}
    for s in saved:
        first.setdefault(s["storage"], s["id"])
        assert s["bytes"] == saved[first[s["storage"]]]["bytes"]
    assert sorted(first, key=first.__getitem__) == list(range(len(first)))


def test_q_k_and_v_cut_from_one_projection_share_one_storage(profiled):
    profile, _, _ = profiled
    qkv_bytes = SIZE * SEQ * 3 * DIM * 4
    groups: dict[int, list[dict[str, Any]]] = {}
    for s in profile["saved"]:
        groups.setdefault(s["storage"], []).append(s)
    qkv = [g for g in groups.values() if g[0]["bytes"] == qkv_bytes and not g[0]["param"]]
    assert len(qkv) == 2  # one projection per block
    for group in qkv:
        shapes = sorted(tuple(s["shape"]) for s in group)
        # q and v as they are, k transposed: three views of the one [4, 12, 48] output.
        assert shapes == [(SIZE, SEQ, DIM), (SIZE, SEQ, DIM), (SIZE, DIM, SEQ)]
        assert {profile["ops"][s["producer"]]["name"] for s in group} == {"aten::bmm"}


def test_parameter_gradient_and_optimizer_bytes_match_the_model(profiled):
    profile, model, _ = profiled
    params = list(model.parameters())
    assert profile["param_bytes"] == profile["grad_bytes"] == nbytes(params)
    # Adam keeps exp_avg and exp_avg_sq per parameter and a float32 step counter.
    assert profile["optimizer_bytes"] == 2 * nbytes(params) + 4 * len(params)
    weights = {p.untyped_storage().data_ptr(): p for p in params}
    marked = [s for s in profile["saved"] if s["param"]]
    assert marked and all(s["bytes"] in {nbytes([p]) for p in weights.values()} for s in marked)


def test_the_collector_ships_a_profile_with_each_new_op_sequence():
    client, events = make_client()  # defaults: sampled every 100 steps
    opseq.setup_once(client)
    model, opt = gpt()
    for n in range(1, 9):
        tokens = batch(12 if n < 5 else 20)
        with collector.step(n):
            train_step(model, opt, tokens)
    client.flush()
    shipped = [e for e in events if e["type"] == "opseq"]
    captured = [e for e in events if e["type"] == "step" and "opseq" in e]
    assert [e["step"] for e in captured] == [2, 6]
    assert [e["hash"] for e in shipped] == [e["opseq"] for e in captured]
    for event in shipped:
        profile = event["profile"]
        assert profile["fingerprint"] == event["hash"]
        assert len(profile["ops"]) == len(event["ops"])
        assert profile["saved"] and profile["param_bytes"] == nbytes(model.parameters())
        params = list(model.parameters())
        assert profile["optimizer_bytes"] == 2 * nbytes(params) + 4 * len(params)
    # Another sequence length, another structure hash only if the op names change: they
    # do not here, the shapes do.
    assert shipped[0]["profile"]["structure"] == shipped[1]["profile"]["structure"]


@pytest.mark.parametrize(
    "broken",
    [
        (ProfileCapture, "profile"),  # building the profile at the step's end
        (ProfileCapture, "_add_saved"),  # in the pack hook, inside autograd
        (ProfileCapture, "enter_module"),  # in the module hook
        (torch._C, "_current_autograd_node"),  # per op and in the unpack hook, in backward
    ],
    ids=lambda b: b[1],
)
def test_a_failing_profiler_never_reaches_user_code(monkeypatch, broken):
    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("profiler bug")

    reference, ref_opt = gpt()
    tokens = batch(SEQ, SIZE)
    train_step(reference, ref_opt, tokens)

    monkeypatch.setattr(*broken, boom)
    client, events = make_client(opseq_every=1)
    opseq.setup_once(client)
    model, opt = gpt()
    with collector.step(0):
        train_step(model, opt, tokens)
    client.flush()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q)  # the same update, bit for bit
    assert [e for e in events if e["type"] == "step"]
    assert not _get_current_dispatch_mode_stack()
    assert torch._C._autograd._top_saved_tensors_default_hooks(True) is None


def test_a_10000_op_profile_ships_well_under_the_ingest_body_limit():
    from backend.settings import Settings

    torch.manual_seed(0)
    layers = torch.nn.ModuleList(
        torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.LayerNorm(8))
        for _ in range(720)
    )
    model = torch.nn.Sequential()
    model.add_module("encoder", torch.nn.Sequential(*layers))  # paths: encoder.123.0
    x = torch.randn(4, 8)
    client, events = make_client(opseq_every=1)
    opseq.setup_once(client)
    with collector.step(0):
        model(x).sum().backward()
    client.flush()
    [event] = [e for e in events if e["type"] == "opseq"]
    profile = event["profile"]
    assert len(profile["ops"]) >= 10_000 and profile["ops"][2000]["module"].startswith("encoder.")
    size = len(json.dumps(event, separators=(",", ":")))  # as the worker encodes it
    limit = Settings.model_fields["max_body_bytes"].default
    print(f"{len(profile['ops'])} ops, {len(profile['saved'])} saved: {size} bytes of JSON")
    assert size < limit / 2


def test_the_server_stores_the_op_sequence_and_accepts_the_new_fields(client, session):
    from sqlalchemy import select

    from backend.telemetry.models import OpSequence, StepRecord

    vigil, events = make_client()
    opseq.setup_once(vigil)
    model, opt = gpt()
    for n in range(1, 4):
        with collector.step(n):
            train_step(model, opt, batch(SEQ, SIZE))
    vigil.flush()
    assert all("shape_fp" in e for e in events if e["type"] == "step")
    assert any("profile" in e for e in events if e["type"] == "opseq")
    body = json.loads(json.dumps(ingest_batch(events)))
    reply = client.post("/api/v1/ingest", json=body, headers=INGEST)
    assert reply.status_code == 200, reply.text
    stored = session.scalars(select(OpSequence)).one()
    [event] = [e for e in body["events"] if e["type"] == "opseq"]
    assert (stored.hash, stored.ops) == (event["hash"], event["ops"])
    assert len(session.scalars(select(StepRecord)).all()) == 3


def test_a_profile_too_large_to_ship_is_left_out_and_counted(monkeypatch):
    monkeypatch.setattr(profile_module, "MAX_EVENT_BYTES", 2_000)
    client, events = make_client(opseq_every=1)
    opseq.setup_once(client)
    model, opt = gpt()
    with collector.step(0):
        train_step(model, opt, batch(SEQ, SIZE))
    client.flush()
    [event] = [e for e in events if e["type"] == "opseq"]
    assert event["ops"] and "profile" not in event
    assert client.worker.drops()["profile_too_large"] == 1

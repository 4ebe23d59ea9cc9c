"""Op-sequence fingerprints: a dispatch mode on sampled steps, real torch, real autograd."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

import collector
from collector.integrations import opseq
from tests.collector.dist_jobs import make_client

DETACH = torch.ops.aten.detach.default


@pytest.fixture
def vigil() -> tuple[Any, list[dict[str, Any]]]:
    client, events = make_client(opseq_every=2)
    opseq.setup_once(client)
    return client, events


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def train_step(model: torch.nn.Module, batch: int = 32) -> None:
    model(torch.randn(batch, 8)).sum().backward()
    model.zero_grad()


def run_steps(client: Any, model: torch.nn.Module, steps: range, batch: int = 32) -> None:
    for n in steps:
        with collector.step(n):
            train_step(model, batch)
    client.flush()  # emits the last step's record


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


def clean_stacks() -> bool:
    return (
        not _get_current_dispatch_mode_stack()
        and torch._C._autograd._top_saved_tensors_default_hooks(True) is None
    )


class Recorder(TorchDispatchMode):
    """A user's own mode: sees every op, like ours does."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[list[Any]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func is not DETACH:
            shapes = [list(a.shape) for a in args if isinstance(a, torch.Tensor)]
            self.ops.append([str(func._schema.name), shapes])
        return out


def test_same_model_same_fingerprint_and_the_sequence_ships_once(vigil):
    client, events = vigil
    run_steps(client, mlp(), range(1, 6))
    steps = {e["step"]: e for e in of_type(events, "step")}
    assert set(steps) == {1, 2, 3, 4, 5}
    assert "opseq" not in steps[1] and "opseq" not in steps[3] and "opseq" not in steps[5]
    fp = steps[2]["opseq"]
    assert steps[4]["opseq"] == fp
    assert isinstance(fp, str) and 0 < len(fp) <= 64 and int(fp, 16) >= 0
    shipped = of_type(events, "opseq")
    assert [e["hash"] for e in shipped] == [fp]
    assert clean_stacks()


def test_other_input_shapes_give_another_fingerprint_shipped_once_more(vigil):
    client, events = vigil
    model = mlp()
    run_steps(client, model, range(0, 3), batch=32)
    run_steps(client, model, range(4, 7), batch=64)
    fps = [e["opseq"] for e in of_type(events, "step") if "opseq" in e]
    assert len(fps) == 4 and fps[0] == fps[1] and fps[2] == fps[3] and fps[0] != fps[2]
    assert [e["hash"] for e in of_type(events, "opseq")] == [fps[0], fps[2]]


def test_forward_and_backward_ops_with_shapes_and_saved_bytes(vigil):
    client, events = vigil
    run_steps(client, mlp(), range(0, 1))
    ops = of_type(events, "opseq")[0]["ops"]
    names = [op[0] for op in ops]
    assert names[:7] == [
        "aten::randn",  # the batch is made inside the step
        "aten::t",
        "aten::addmm",
        "aten::relu",
        "aten::t",
        "aten::addmm",
        "aten::sum",
    ]
    assert "aten::threshold_backward" in names  # relu's backward: autograd ops are seen
    assert names.count("aten::mm") == 3  # grads of both weights and of the hidden layer
    assert "aten::detach" not in names
    assert ops[2][1] == [[16], [32, 8], [8, 16]]
    saved = {i: op[2] for i, op in enumerate(ops) if op[2]}
    # addmm saves its input (x: 32*8 floats), relu its output, the second addmm its input
    # (relu's output); the weights it saves are parameters and are not counted.
    assert saved == {2: 32 * 8 * 4, 3: 32 * 16 * 4, 5: 32 * 16 * 4}


def test_recording_does_not_change_the_sequence(vigil):
    client, events = vigil
    model = mlp()
    user = Recorder()
    torch.manual_seed(1)
    with collector.step(0), user:
        train_step(model)
    client.flush()
    ops = of_type(events, "opseq")[0]["ops"]
    assert [op[:2] for op in ops] == user.ops


def test_user_mode_inside_around_and_across_steps(vigil):
    client, events = vigil
    model = mlp()
    spanning = Recorder()
    with spanning, collector.step(0):  # entered before a sampled step, left after it
        train_step(model)
    inner = Recorder()
    with collector.step(2), inner:
        train_step(model)
    # Across boundaries, as optimizer-driven steps do: left inside the next step …
    crossing = Recorder()
    crossing.__enter__()
    client.begin_step(4)
    train_step(model)
    crossing.__exit__(None, None, None)
    client.end_step()
    assert clean_stacks()
    # … and entered inside a step, left after it.
    late = Recorder()
    client.begin_step(6)
    late.__enter__()
    train_step(model)
    client.end_step()
    assert _get_current_dispatch_mode_stack() == [late]
    late.__exit__(None, None, None)
    client.flush()
    assert clean_stacks()
    assert spanning.ops and inner.ops and crossing.ops and late.ops
    fps = [e["opseq"] for e in of_type(events, "step") if "opseq" in e]
    assert len(fps) == 4 and len(set(fps)) == 1


def test_a_step_that_raises_still_leaves_the_mode(vigil):
    client, events = vigil
    with pytest.raises(RuntimeError, match="boom"), collector.step(0):
        mlp()(torch.randn(4, 8)).sum().backward()
        raise RuntimeError("boom")
    assert clean_stacks()
    client.flush()
    assert of_type(events, "step")[0]["opseq"]


def test_a_step_started_over_an_open_one_closes_the_capture(vigil):
    client, events = vigil
    client.begin_step(0)
    train_step(mlp())
    client.begin_step(1)  # step 0 never ended
    assert clean_stacks()
    client.end_step()
    assert len(of_type(events, "opseq")) == 1


def test_users_saved_tensor_hooks_keep_precedence(vigil):
    client, events = vigil
    packed = []

    def pack(t):  # type: ignore[no-untyped-def]
        packed.append(t.shape)
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with collector.step(0):
            train_step(mlp())
        top = torch._C._autograd._top_saved_tensors_default_hooks(True)
        assert top is not None and top[0] is pack
    assert packed  # theirs ran, ours did not replace them
    assert clean_stacks()
    client.flush()
    ops = of_type(events, "opseq")[0]["ops"]
    assert ops and all(op[2] == 0 for op in ops)


def test_saved_tensor_hooks_pushed_inside_a_step_survive_its_end(vigil):
    client, _ = vigil
    client.begin_step(0)
    hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: t.detach(), lambda t: t)
    hooks.__enter__()
    train_step(mlp())
    client.end_step()
    top = torch._C._autograd._top_saved_tensors_default_hooks(True)
    assert top is not None and top[0] is hooks.pack_hook
    hooks.__exit__(None, None, None)
    assert clean_stacks()


def test_off_and_unsampled_steps_run_without_a_mode():
    client, events = make_client(opseq_every=0)
    opseq.setup_once(client)
    seen = []

    class Probe(collector.client.StepListener):
        def on_step_start(self, step: int) -> None:
            seen.append(list(_get_current_dispatch_mode_stack()))

    client.add_step_listener(Probe())
    run_steps(client, mlp(), range(0, 2))
    assert seen == [[], []]
    assert not of_type(events, "opseq")


def test_setup_once_attaches_to_each_new_client():
    first, _ = make_client(opseq_every=1)
    opseq.setup_once(first)
    opseq.setup_once(first)
    second, events = make_client(opseq_every=1)
    opseq.setup_once(second)
    assert sum(isinstance(x, opseq.OpSeqListener) for x in first._listeners) == 1
    assert sum(isinstance(x, opseq.OpSeqListener) for x in second._listeners) == 1
    run_steps(second, mlp(), range(0, 1))
    assert of_type(events, "opseq")


def test_ops_past_the_cap_are_counted_not_kept(vigil, monkeypatch):
    client, events = vigil
    monkeypatch.setattr(opseq, "MAX_OPS", 5)
    run_steps(client, mlp(), range(0, 1))
    assert len(of_type(events, "opseq")[0]["ops"]) == 5


def test_higher_order_ops_and_compiled_code_run_on_sampled_steps(vigil):
    client, events = vigil
    x = torch.randn(4, requires_grad=True)
    compiled = torch.compile(lambda t: t.sin().cos(), backend="eager")
    with collector.step(0):
        y = torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))
        (y.sum() + compiled(x).sum()).backward()
    assert clean_stacks()
    client.flush()
    names = [op[0] for op in of_type(events, "opseq")[0]["ops"]]
    assert names.count("hop::cond") == 2  # forward and backward
    assert x.grad is not None


# -- the cheap per-step shape fingerprint and the capture it triggers (issue 14, item 0) --


def run_gpt(client: Any, seqs: dict[int, int], model: Any = None) -> None:
    """Train ``TinyGPT`` on the steps given, each with its sequence length."""
    from tests.collector.tiny_models import batch, gpt
    from tests.collector.tiny_models import train_step as gpt_step

    model, opt = gpt() if model is None else model
    for n, seq in seqs.items():
        tokens = batch(seq)
        with collector.step(n):
            gpt_step(model, opt, tokens)
    client.flush()


def test_every_step_carries_a_shape_fingerprint_that_follows_the_sequence_length():
    client, events = make_client()  # defaults: full capture sampled every 100 steps
    opseq.setup_once(client)
    run_gpt(client, {n: 16 if n < 5 else 24 for n in range(1, 9)})
    steps = {e["step"]: e for e in of_type(events, "step")}
    assert sorted(steps) == list(range(1, 9))
    fps = [steps[n].get("shape_fp") for n in range(1, 9)]
    assert all(isinstance(fp, str) and len(fp) == 16 for fp in fps)
    assert len(set(fps[:4])) == 1 and len(set(fps[4:])) == 1
    assert fps[0] != fps[4]


def test_the_full_capture_runs_on_the_step_after_a_new_shape_fingerprint():
    client, events = make_client()  # opseq_every=100: no sampled step in 1..10
    opseq.setup_once(client)
    run_gpt(client, {n: 16 if n < 5 else 24 for n in range(1, 11)})
    steps = {e["step"]: e for e in of_type(events, "step")}
    # Step 1's shapes are new (first sight): step 2 is captured; the change at step 5 is
    # captured at step 6, not at step 100.
    assert sorted(n for n, e in steps.items() if "opseq" in e) == [2, 6]
    assert steps[2]["opseq"] != steps[6]["opseq"]
    assert [e["hash"] for e in of_type(events, "opseq")] == [steps[2]["opseq"], steps[6]["opseq"]]
    assert clean_stacks()


def test_alternating_shapes_are_captured_once_each():
    client, events = make_client()
    opseq.setup_once(client)
    run_gpt(client, {n: 16 if n % 2 else 24 for n in range(1, 21)})
    captured = [e["step"] for e in of_type(events, "step") if "opseq" in e]
    # Step 1 runs 16: step 2 is captured but runs 24 (a miss); the next 16 (step 3) arms
    # two steps on, step 5, which runs 16. Both buckets captured, then nothing more.
    assert captured == [2, 5]
    assert len(of_type(events, "opseq")) == 2


def test_shapes_that_change_every_step_back_off_to_the_sampling_period():
    client, events = make_client(opseq_every=100)
    opseq.setup_once(client)
    model = mlp()
    for n in range(1, 41):
        with collector.step(n):
            train_step(model, batch=n)
    client.flush()
    captured = [e["step"] for e in of_type(events, "step") if "opseq" in e]
    # Every capture misses: the delay grows (1, 2, 3, …) and the gap between triggered
    # captures doubles (1, 2, 4, 8, 16, …), so about one step in the sampling period.
    assert captured == [2, 5, 9, 14, 22, 38]


def test_shape_fingerprint_off_and_unsampled_steps_pay_nothing():
    client, events = make_client(opseq_shapes=False)
    opseq.setup_once(client)
    run_gpt(client, {1: 16, 2: 16, 3: 24, 4: 24})
    steps = of_type(events, "step")
    assert len(steps) == 4 and not any("shape_fp" in e or "opseq" in e for e in steps)


def test_a_compiled_model_is_not_recompiled_by_the_module_hook():
    import warnings

    from torch._dynamo.utils import counters

    client, events = make_client()
    opseq.setup_once(client)
    torch._dynamo.reset()
    counters.clear()
    model = mlp()
    compiled = torch.compile(model, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that global hooks see the wrapper too
        for n in range(1, 6):
            with collector.step(n):
                compiled(torch.randn(32, 8)).sum().backward()
    client.flush()
    assert counters["stats"]["unique_graphs"] == 1
    fps = [e.get("shape_fp") for e in of_type(events, "step")]
    assert len(fps) == 5 and fps[0] and len(set(fps)) == 1

"""torch.distributed integration: real two-rank gloo jobs (see ``dist_jobs``)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from collector.integrations import torch_distributed
from tests.collector.dist_jobs import make_client, run_job


@pytest.fixture(scope="module")
def collectives(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_job("collectives", tmp_path_factory.mktemp("collectives"))


@pytest.fixture(scope="module")
def blocked(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_job("blocked", tmp_path_factory.mktemp("blocked"))


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_job("ddp", tmp_path_factory.mktemp("ddp"))


def by_step(events: list[dict[str, Any]], step: int) -> list[tuple[str, str, int, int, int]]:
    """(group, op, seq, bytes, count) of a step's collective events, in seq order."""
    rows = [
        (e["group"], e["op"], e["seq"], e["bytes"], e["count"])
        for e in events
        if e.get("step") == step
    ]
    return sorted(rows, key=lambda r: (r[0], r[2]))


def test_blocking_calls_are_aggregated_per_step_with_bytes_and_seq(collectives):
    for rank, out in enumerate(collectives):
        assert out["all_reduce_value"] == 3.0 and out["broadcast_ok"]
        assert out["all_gather_value"] == [0, 1] and out["recv_value"] == 7.0
        p2p = "send" if rank == 0 else "recv"
        assert by_step(out["events"], 0) == [
            ("world", "all_reduce", 3, 3 * 1000 * 4, 3),
            ("world", "broadcast", 4, 256 * 4, 1),
            ("world", "all_gather", 5, 10 * 8, 1),
            ("world", "barrier", 6, 0, 1),
            ("world", p2p, 6, 100 * 4, 1),  # p2p: the number of collectives before it
        ]
        world = [e for e in out["events"] if e["group"] == "world"]
        assert all("members" not in e and e["duration_s"] >= 0 for e in world)


def test_async_objects_batches_and_subgroups(collectives):
    for rank, out in enumerate(collectives):
        peer_op = "isend" if rank == 0 else "irecv"
        name = out["pair_name"]
        rows = by_step(out["events"], 1)
        assert [r[:3] for r in rows] == [
            (f"pair/{name}", "all_reduce", 1),
            ("world", "all_reduce", 7),
            ("world", peer_op, 7),
            ("world", "all_gather_object", 8),
            ("world", "batch_isend_irecv", 8),  # two calls; p2p does not advance the seq
        ]
        sizes = {r[1]: r[3] for r in rows}
        assert sizes["irecv" if rank else "isend"] == 32 * 4
        assert sizes["batch_isend_irecv"] == 2 * 2 * 16 * 4
        assert rows[-1][4] == 2
        assert sizes["all_gather_object"] > 100  # the pickled objects and their sizes
        pair = next(e for e in out["events"] if e["group"].startswith("pair/"))
        assert pair["members"] == [0, 1]
        assert out["objects"] == [{"rank": r, "pad": "x" * 100} for r in range(2)]
        assert out["batch_value"] == float(1 - rank)


def test_async_work_is_in_flight_until_it_completes(collectives):
    # Rank 1 joins the async all_reduce and the irecv 0.6 s late: rank 0's records are in
    # flight after the calls return and last until the work completes.
    waiting = collectives[0]
    assert waiting["async_inflight"] == ["world", "all_reduce", 7]
    for out in collectives:
        assert out["isend_parked"]  # gloo p2p Work has no future: ends at wait()
        assert out["async_inflight_after"] and out["isend_inflight_after"]
        assert out["batch_inflight_after"]
    durations = {(e["group"], e["op"], e["step"]): e["duration_s"] for e in waiting["events"]}
    assert durations[("world", "all_reduce", 1)] >= 0.3
    assert durations[("world", "isend", 1)] >= 0.3


def test_without_a_client_collectives_are_plain_torch(collectives):
    for out in collectives:
        assert out["no_client_events"] == 0
        assert out["no_client_value"] == 6.0  # (1 + 2) summed twice, then sent to rank 1
        assert by_step(out["events"], 2) == []


def test_a_blocked_rank_reports_the_collective_it_is_in(blocked):
    waiting, late = blocked
    assert waiting["waited_s"] >= 1.0
    assert waiting["seen"]["inflight"] == ["world", "all_reduce", 2, 5]
    beat = waiting["seen"]["beat"]
    assert (beat["group"], beat["op"], beat["seq"]) == ("world", "all_reduce", 2)
    assert abs(beat["since"] - waiting["started"]) < 0.5
    assert not waiting["after"] and not late["after"]


def test_ddp_buckets_become_all_reduce_records(ddp):
    for out in ddp:
        assert out["same_as_builtin"] and out["changed"]
        steps: dict[int | None, list[dict[str, Any]]] = {}
        for e in out["events"]:
            steps.setdefault(e.get("step"), []).append(e)
        # DDP's construction broadcasts parameters and buffers (outside any step) …
        setup = steps.pop(None)
        assert [(e["op"], e["bytes"], e["count"]) for e in setup] == [
            ("broadcast", out["param_bytes"] + 16, 1)
        ] * 4
        slow = next(e for e in steps.pop(30) if e["op"] == "all_reduce")
        assert slow["count"] == 1
        assert out["slow_backward_s"] >= slow["duration_s"]  # 3/4 of it is the chaos delay
        assert sorted(steps) == [0, 1, 2, 10, 11, 20, 21]
        counts = []
        for step, events in sorted(steps.items()):
            ops = {e["op"]: e for e in events}
            assert sorted(ops) == ["all_reduce", "broadcast"], step
            assert all(e["group"] == "world" for e in events)
            # … and its buffers before every forward;
            assert (ops["broadcast"]["bytes"], ops["broadcast"]["count"]) == (16, 1)
            # one all_reduce record per gradient bucket, the user's nested all_reduce not
            # counted again.
            assert ops["all_reduce"]["bytes"] == out["param_bytes"], step
            counts.append(ops["all_reduce"]["count"])
        assert max(counts) >= 2  # bucket_cap_mb=0.1 splits the model after the first step
        seqs = [e["seq"] for s in sorted(steps) for e in sorted(steps[s], key=lambda e: e["seq"])]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_user_ddp_hooks_run_before_and_after_the_first_forward(ddp):
    for out in ddp:
        assert out["calls"] == {"before": 3, "after": 3}
        assert out["same_with_hooks"]


def test_setup_is_idempotent_and_wrappers_look_like_torch():
    client, _ = make_client()
    torch_distributed.setup_once(client)
    torch_distributed.setup_once(client)
    for name in ("all_reduce", "broadcast", "isend", "barrier", "batch_isend_irecv"):
        wrapper = getattr(dist, name)
        assert getattr(c10d, name) is wrapper
        original = wrapper.__wrapped__
        assert original is torch_distributed._originals[name]  # wrapped once
        assert wrapper.__name__ == name and wrapper.__doc__ == original.__doc__
        assert inspect.signature(wrapper) == inspect.signature(original)
    from torch.distributed._functional_collectives import traceable_collective_remaps

    assert dist.all_reduce in traceable_collective_remaps  # torch.compile still maps it
    from torch.distributed.tensor import _collective_utils

    assert _collective_utils.broadcast is dist.broadcast


def test_payload_bytes():
    tensors = [torch.zeros(3, dtype=torch.float16), torch.zeros(2, 2, dtype=torch.int64)]
    assert torch_distributed._tensor_bytes(tensors) == 3 * 2 + 4 * 8
    assert torch_distributed._tensor_bytes(None) == 0


@pytest.fixture(scope="module")
def before_init(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_job("ddp_before_init", tmp_path_factory.mktemp("before_init"))


def test_ddp_built_before_init_is_timed_and_an_untimeable_one_is_reported(before_init):
    for rank, out in enumerate(before_init):
        # The plain DDP built (and even stepped) before init: its buckets are timed.
        assert out["all_reduce_steps"] == [0, 1, 2]
        # The one with a C++ hook cannot be: said once, in the log and as an event the job
        # page shows ("collectives not timed on ranks …").
        [event] = out["untimed"]
        assert event["attrs"]["rank"] == rank and event["attrs"]["what"] == "ddp_gradients"
        assert "C++" in event["attrs"]["reason"]
        assert len(out["warnings"]) == 1 and f"rank {rank}" in out["warnings"][0]

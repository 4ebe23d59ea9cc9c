"""Two-rank gloo jobs for the torch.distributed integration tests.

``run_job(name, tmp_path)`` starts ``WORLD`` spawned processes on 127.0.0.1; each builds a
real process group and a collector ``Client`` whose ``worker.submit`` appends to a list (the
HTTP path is tested elsewhere), runs the job function named ``name`` and writes what it
returns to ``rank<N>.json``. The parent gets one result per rank.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

WORLD = 2


def run_job(name: str, tmp_path: Path, timeout: float = 90.0, **kwargs: Any) -> list[Any]:
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs = [
        ctx.Process(target=_entry, args=(rank, port, name, str(tmp_path), kwargs))
        for rank in range(WORLD)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
        p.join(5)
    assert not alive, f"job {name} timed out after {timeout}s"
    results = []
    for rank, p in enumerate(procs):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert "error" not in out, f"rank {rank} failed:\n{out.get('error')}"
        assert p.exitcode == 0, f"rank {rank} exited with {p.exitcode}"
        results.append(out["result"])
    return results


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(rank: int, port: int, name: str, out_dir: str, kwargs: dict[str, Any]) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    out: dict[str, Any]
    try:
        import torch.distributed as dist

        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=WORLD,
            timeout=datetime.timedelta(seconds=60),
        )
        if name in BEFORE_INIT:  # the job sets the collector up itself, part-way through
            result = BEFORE_INIT[name](rank, **kwargs)
        else:
            client, events = make_client(rank, **kwargs.pop("config", {}))
            result = JOBS[name](rank, client, events, **kwargs)
        dist.barrier()
        dist.destroy_process_group()
        out = {"result": result}
    except BaseException:
        out = {"error": traceback.format_exc()}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
    if name in BEFORE_INIT and "error" not in out:
        # A DDP with a built-in C++ comm hook sometimes aborts torch's own teardown at
        # interpreter exit ("terminate called without an active exception", SIGABRT) after
        # the group was destroyed and the results written: not the collector's doing.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def make_client(rank: int = 0, **config: Any) -> tuple[Any, list[dict[str, Any]]]:
    """A live client (set as the module's) whose events land in a list."""
    import collector
    from collector.client import Client
    from collector.config import Config
    from collector.integrations import torch_distributed

    environ = {"RANK": str(rank), "WORLD_SIZE": str(WORLD)}
    client = Client(Config.resolve(endpoint="http://127.0.0.1:9", environ=environ, **config))
    events: list[dict[str, Any]] = []
    client.worker.submit = events.append  # type: ignore[method-assign]
    collector._client = client
    torch_distributed.setup_once(client)
    return client, events


def collectives(rank: int, client: Any, events: list[dict[str, Any]]) -> dict[str, Any]:
    """Every kind of call inside steps; returns the collective events of each step."""
    import torch
    import torch.distributed as dist

    out: dict[str, Any] = {}
    peer = 1 - rank

    client.begin_step(0)  # blocking calls
    for _ in range(3):
        t = torch.full((1000,), float(rank + 1))
        dist.all_reduce(t)
    out["all_reduce_value"] = t[0].item()
    b = torch.arange(256, dtype=torch.float32) * (rank + 1)
    dist.broadcast(b, src=0)
    out["broadcast_ok"] = bool(torch.equal(b, torch.arange(256, dtype=torch.float32)))
    gathered = [torch.zeros(10, dtype=torch.int64) for _ in range(WORLD)]
    dist.all_gather(gathered, torch.full((10,), rank, dtype=torch.int64))
    out["all_gather_value"] = [int(g[0]) for g in gathered]
    dist.barrier()
    p2p = torch.full((100,), 7.0) if rank == 0 else torch.zeros(100)
    if rank == 0:
        dist.send(p2p, dst=1)
    else:
        dist.recv(p2p, src=0)
    out["recv_value"] = p2p[0].item()
    client.end_step()

    client.begin_step(1)  # async, objects, batched p2p, a subgroup
    if rank == 1:
        time.sleep(0.6)
    t = torch.ones(64)
    work = dist.all_reduce(t, async_op=True)
    call = client.inflight()
    out["async_inflight"] = None if call is None else [call.group, call.op, call.seq]
    work.wait()
    out["async_inflight_after"] = _settled(client)
    if rank == 1:
        time.sleep(0.6)
    buf = torch.full((32,), float(rank))
    work = dist.isend(buf, peer) if rank == 0 else dist.irecv(buf, peer)
    # Recorded until waited on, but parked (not reported) until a thread waits on it.
    out["isend_parked"] = client.inflight() is None and bool(client._inflight)
    work.wait()
    out["isend_inflight_after"] = _settled(client)
    out["irecv_value"] = buf[0].item()
    objs: list[Any] = [None] * WORLD
    dist.all_gather_object(objs, {"rank": rank, "pad": "x" * 100})
    out["objects"] = objs
    send, recv = torch.full((16,), float(rank)), torch.zeros(16)
    ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    out["batch_value"] = recv[0].item()
    # P2POps built from functions bound before the collector was set up
    isend, irecv = dist.isend.__wrapped__, dist.irecv.__wrapped__
    ops = [dist.P2POp(isend, send, peer), dist.P2POp(irecv, recv, peer)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    out["batch_inflight_after"] = _settled(client)
    pair = dist.new_group([0, 1], group_desc="pair")
    dist.all_reduce(torch.ones(8), group=pair)
    out["pair_name"] = pair.group_name
    client.end_step()

    client.begin_step(2)  # no client: plain torch
    import collector

    collector._client = None
    before = len(events)
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    dist.all_reduce(t, async_op=True).wait()
    dist.isend(t, peer).wait() if rank == 0 else dist.irecv(t, peer).wait()
    out["no_client_value"] = t[0].item()
    out["no_client_events"] = len(events) - before
    collector._client = client
    client.end_step()
    client.begin_step(3)  # emits step 2's pending record
    client.end_step()
    out["events"] = [e for e in events if e["type"] == "collective"]
    return out


def _settled(client: Any, timeout: float = 5.0) -> bool:
    """Whether the in-flight record clears (a future callback may run on gloo's thread)."""
    deadline = time.monotonic() + timeout
    while client.inflight() is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def blocked(rank: int, client: Any, events: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank 1 joins late; rank 0's heartbeat reports the all_reduce it is blocked in."""
    import torch
    import torch.distributed as dist

    out: dict[str, Any] = {}
    client.begin_step(5)
    dist.all_reduce(torch.ones(4))  # seq 1
    if rank == 1:
        time.sleep(2.0)
    seen: dict[str, Any] = {}

    def watch() -> None:
        time.sleep(0.7)
        call = client.inflight()
        if call is not None:
            seen["inflight"] = [call.group, call.op, call.seq, call.step]
        seen["beat"] = client._tick()[0].get("inflight")

    watcher = threading.Thread(target=watch)
    watcher.start()
    started = time.time()
    dist.all_reduce(torch.ones(4))  # seq 2: rank 0 waits here
    out["waited_s"] = time.time() - started
    watcher.join()
    out["seen"] = seen
    out["started"] = started
    out["after"] = client.inflight() is not None
    client.end_step()
    return out


def ddp(rank: int, client: Any, events: list[dict[str, Any]]) -> dict[str, Any]:
    """DDP buckets become all_reduce records; training matches DDP without the collector."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import collector

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
            torch.nn.ReLU(), torch.nn.Linear(256, 8),
        )  # fmt: skip
        net.register_buffer("scale", torch.ones(4))  # DDP broadcasts it before each forward
        return net

    def train(net: torch.nn.Module, steps: int, first: int, hook: Any = None) -> None:
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        torch.manual_seed(100 + rank)
        for i in range(steps):
            x = torch.randn(16, 32)
            client.begin_step(first + i)
            loss = net(x).pow(2).mean()
            if hook is not None and i == 0:
                net.register_comm_hook(None, hook)  # after the first forward
            loss.backward()
            opt.step()
            opt.zero_grad()
            client.end_step()

    out: dict[str, Any] = {}
    reference = model()
    collector._client = None  # armed, but no client at the first forward: built-in path
    plain = DDP(model(), bucket_cap_mb=0.1)
    train_plain = torch.optim.SGD(plain.parameters(), lr=0.1)
    torch.manual_seed(100 + rank)
    for _ in range(3):
        plain(torch.randn(16, 32)).pow(2).mean().backward()
        train_plain.step()
        train_plain.zero_grad()
    collector._client = client

    timed = DDP(model(), bucket_cap_mb=0.1)
    train(timed, 3, first=0)
    out["same_as_builtin"] = all(
        torch.allclose(a, b, atol=1e-6)
        for a, b in zip(plain.parameters(), timed.parameters(), strict=True)
    )
    out["changed"] = not all(
        torch.equal(a, b) for a, b in zip(reference.parameters(), timed.parameters(), strict=True)
    )
    out["param_bytes"] = sum(p.numel() * p.element_size() for p in timed.parameters())

    calls = {"before": 0, "after": 0}

    # DDP checks hook annotations against dist.GradBucket; these strings would not match.
    def user_hook(state, bucket):  # type: ignore[no-untyped-def]
        calls["before"] += 1
        t = bucket.buffer().div_(dist.get_world_size())
        return dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0])

    def late_hook(state, bucket):  # type: ignore[no-untyped-def]
        calls["after"] += 1
        t = bucket.buffer().div_(dist.get_world_size())
        return dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0])

    early = DDP(model(), bucket_cap_mb=0.1)
    early.register_comm_hook(None, user_hook)  # before the first forward
    train(early, 2, first=10)
    late = DDP(model(), bucket_cap_mb=0.1)
    train(late, 2, first=20, hook=late_hook)  # replaces ours after the first forward
    out["calls"] = calls
    out["same_with_hooks"] = all(
        torch.allclose(a, b, atol=1e-6)
        for a, b in zip(early.parameters(), late.parameters(), strict=True)
    )
    # slow_collective chaos: the delay is slept where the bucket's future completes, so
    # backward really takes longer (the recorded duration includes it).
    from collector.chaos import Chaos

    single = DDP(model())  # one bucket: its record is the whole wait
    client.chaos = Chaos.parse("slow_collective:factor=4", rank=rank, attempt=0)
    x = torch.randn(16, 32)
    client.begin_step(30)
    loss = single(x).pow(2).mean()
    started = time.perf_counter()
    loss.backward()
    out["slow_backward_s"] = time.perf_counter() - started
    client.end_step()
    client.chaos = Chaos([], rank)
    client.begin_step(99)
    client.end_step()
    out["events"] = [e for e in events if e["type"] == "collective"]
    return out


def p2p_peers(rank: int, client: Any, events: list[dict[str, Any]]) -> dict[str, Any]:
    """What rank 0's heartbeat says while it waits for rank 1 (late each time) in a blocking
    receive and in a batch of p2p ops, and between posting that batch and waiting on it."""
    import torch
    import torch.distributed as dist

    out: dict[str, Any] = {}
    peer = 1 - rank

    def beat_during(wait: Any, delay: float = 0.5) -> Any:
        seen: list[Any] = []

        def watch() -> None:
            time.sleep(delay)
            seen.append(client._tick()[0].get("inflight"))

        watcher = threading.Thread(target=watch)
        watcher.start()
        wait()
        watcher.join()
        return seen[0]

    client.begin_step(0)
    dist.all_reduce(torch.ones(2))  # seq 1
    t = torch.zeros(4)
    if rank == 1:
        time.sleep(1.0)
        dist.send(t, dst=0)
    else:
        out["recv"] = beat_during(lambda: dist.recv(t, src=1))
    if rank == 1:
        time.sleep(1.0)
    ops = [dist.P2POp(dist.isend, torch.ones(4), peer), dist.P2POp(dist.irecv, t, peer)]
    works = dist.batch_isend_irecv(ops)
    out["batch_posted"] = client._tick()[0].get("inflight")
    out["batch"] = beat_during(lambda: [w.wait() for w in works])
    dist.barrier()  # seq 2
    client.end_step()
    return out


JOBS = {"collectives": collectives, "blocked": blocked, "ddp": ddp, "p2p_peers": p2p_peers}


def ddp_before_init(rank: int) -> dict[str, Any]:
    """``vigil.init()`` after the model was wrapped in DDP (issue 17): a plain DDP and one
    with a built-in C++ hook, both built before the collector was set up."""
    import logging

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    early = DDP(model())
    builtin = DDP(model())
    builtin._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)  # C++: untimeable
    early(torch.randn(4, 16)).sum().backward()  # and a step before init, too

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("vigil.collector").addHandler(Keep(level=logging.WARNING))
    client, events = make_client(rank)
    for step in range(3):
        for net, first in ((early, 0), (builtin, 10)):
            client.begin_step(first + step)
            net(torch.randn(4, 16)).sum().backward()
            client.end_step()
    client.begin_step(99)
    client.end_step()
    return {
        "all_reduce_steps": sorted(
            {e["step"] for e in events if e["type"] == "collective" and e["op"] == "all_reduce"}
        ),
        "untimed": [
            e for e in events if e["type"] == "event" and e["name"] == "collectives_untimed"
        ],
        "warnings": [m for m in records if "not timed" in m],
    }


BEFORE_INIT = {"ddp_before_init": ddp_before_init}

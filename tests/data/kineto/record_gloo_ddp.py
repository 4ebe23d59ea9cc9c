"""Record real PyTorch profiler traces of a small DDP job on gloo, one file per rank.

    python tests/data/kineto/record_gloo_ddp.py tests/data/kineto/gloo_ddp_2ranks
    python tests/data/kineto/record_gloo_ddp.py tests/data/kineto/gloo_ddp_4ranks_straggler \\
        --ranks 4 --active 30 --slow-rank 2 --slow-from 12 --slow-s 0.05

``--ranks`` processes train a small MLP with DistributedDataParallel over gloo (CPU) under
``torch.profiler`` (schedule: no wait, one warm-up step, ``--active`` recorded steps; input
shapes recorded). With ``--slow-rank``, that rank sleeps ``--slow-s`` seconds in its
forward pass from iteration ``--slow-from`` on: a real straggler, which the others wait for
in the gradient all-reduce. Each rank's trace is written by ``export_chrome_trace`` and
gzipped. Recorded once; the tests read the files (``tests/backend/importers/``).
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile, schedule


def _rank(rank: int, opts: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(opts.port))
    dist.init_process_group("gloo", rank=rank, world_size=opts.ranks)
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    model = torch.nn.parallel.DistributedDataParallel(mlp)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = Path(opts.out) / f"rank-{rank}.json"

    def ready(prof: profile) -> None:
        prof.export_chrome_trace(str(path))

    sched = schedule(wait=opts.wait, warmup=1, active=opts.active)
    with profile(
        activities=[ProfilerActivity.CPU], schedule=sched, record_shapes=True, on_trace_ready=ready
    ) as prof:
        for i in range(opts.wait + 1 + opts.active):
            x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
            if rank == opts.slow_rank and i >= opts.slow_from:
                time.sleep(opts.slow_s)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            prof.step()
    dist.destroy_process_group()
    with path.open("rb") as src, gzip.open(f"{path}.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--wait", type=int, default=1)
    parser.add_argument("--active", type=int, default=3)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-from", type=int, default=0)
    parser.add_argument("--slow-s", type=float, default=0.0)
    parser.add_argument("--port", type=int, default=29731)
    opts = parser.parse_args()
    Path(opts.out).mkdir(parents=True, exist_ok=True)
    mp.spawn(_rank, args=(opts,), nprocs=opts.ranks)  # type: ignore[attr-defined,no-untyped-call]

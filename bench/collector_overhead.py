"""What the collector costs a training step, against bare steps and against the profiler.

A small GPT-style model trained with 2-rank DDP over gloo on CPU. Each rank runs blocks of
steps in five modes, interleaved in a shuffled order that both ranks share (DDP needs them
in lockstep), so drift in machine load hits every mode alike:

- ``bare``      no collector client (the integrations' patches cost one ``None`` check);
- ``noshape``   the defaults without the per-step shape fingerprint (``opseq_shapes=False``),
                to isolate what that costs;
- ``defaults``  the collector at its defaults (op sequence sampled every 100 steps and on
                the step after a new shape fingerprint; the shape fingerprint every step);
- ``opseq``     full op-sequence capture on every step (``opseq_every=1``);
- ``profiler``  ``torch.profiler.profile(record_shapes=True)``, what people use today to
                see op sequences.

The shape fingerprint's global module hooks stay registered once a step installed them;
the benchmark removes them before each ``bare`` and ``noshape`` block, so those modes pay
nothing for them (a sampled ``noshape`` step re-adds them for the rest of its block).

The collector ships to a real ``vigil server`` (embedded, SQLite) that the benchmark
starts. Page-fault noise from glibc's allocator can make instrumented steps look *faster*
than bare ones (freed memory returned to the OS and faulted back in), so the ranks run
with fixed ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_``.

    python bench/collector_overhead.py                   # both configurations
    python bench/collector_overhead.py --config dispatch --blocks 12
    python bench/collector_overhead.py --config dispatch --clock cpu   # on a busy machine
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("bare", "noshape", "defaults", "opseq", "profiler")
CONFIGS = {
    # A compute-heavy step (hundreds of ms on CPU), like a GPU step is wall-clock heavy.
    "gpt": {"dim": 256, "layers": 4, "heads": 4, "seq": 128, "batch": 8, "vocab": 2048},
    # Dispatch-bound: a few ms per step, where per-op Python costs show (as on a GPU,
    # where the CPU only launches kernels).
    "dispatch": {"dim": 32, "layers": 2, "heads": 2, "seq": 16, "batch": 2, "vocab": 256},
}
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def rank_main(args: argparse.Namespace) -> None:
    """One DDP rank: run the interleaved schedule, write step times to a JSON file."""
    import torch
    import torch.distributed as dist
    from torch.nn import functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import collector
    from collector.client import Client
    from collector.config import Config
    from collector.integrations import setup_integrations
    from collector.integrations.shape_fp import RECORDER
    from examples.train_tiny_gpt import TinyGPT

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg = CONFIGS[args.config]
    clients = {
        "defaults": Client(
            Config.resolve(
                job=f"overhead-{args.config}", endpoint=args.endpoint, token="vigil-dev-ingest"
            )
        ),
        "noshape": Client(
            Config.resolve(
                job=f"overhead-{args.config}-noshape",
                endpoint=args.endpoint,
                token="vigil-dev-ingest",
                opseq_shapes=False,
            )
        ),
        "opseq": Client(
            Config.resolve(
                job=f"overhead-{args.config}-opseq",
                endpoint=args.endpoint,
                token="vigil-dev-ingest",
                opseq_every=1,
            )
        ),
    }
    for client in clients.values():
        setup_integrations(client)
    collector._client = clients["defaults"]  # DDP's timing hook installs at first forward

    torch.manual_seed(0)
    model = TinyGPT(cfg["vocab"], cfg["dim"], cfg["layers"], cfg["heads"], cfg["seq"])
    ddp = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    tokens = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), generator=gen)

    # Wall time, or the training thread's CPU time (--clock cpu): on a loaded machine the
    # latter leaves out the time the thread waited for a core (and gloo's own threads).
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter

    def train_step(step: int) -> float:
        started = clock()
        with collector.step(step):
            logits = ddp(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, cfg["vocab"]), tokens[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        collector.log(loss=loss.item())
        return clock() - started

    step = 0
    for _ in range(args.warmup):  # allocator, caches, DDP buckets
        train_step(step)
        step += 1
    schedule = random.Random(42)  # the same order on both ranks
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(args.blocks):
        order = list(MODES)
        schedule.shuffle(order)
        for mode in order:
            collector._client = clients.get(mode)
            if mode in ("bare", "noshape"):  # no global module hooks at all (see its docs)
                RECORDER.uninstall()
            if mode == "profiler":
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
                    block = [train_step(step + i) for i in range(args.steps)]
            else:
                block = [train_step(step + i) for i in range(args.steps)]
            step += args.steps
            times[mode] += block[1:]  # the first step of a block absorbs the switch
    collector._client = None
    for client in clients.values():
        client.shutdown(5)
    Path(args.out).with_suffix(f".rank{rank}.json").write_text(json.dumps(times))
    dist.destroy_process_group()


def start_server(port: int, db: Path) -> subprocess.Popen[bytes]:
    # Detection off: while one mode runs, the other client's job sits idle with live
    # heartbeats, which is (correctly) a hang; those incidents would only add noise here.
    env = {
        **os.environ,
        "VIGIL_DATABASE_URL": f"sqlite:///{db}",
        "VIGIL_LOG_LEVEL": "WARNING",
        "VIGIL_DETECT_INTERVAL_S": "0",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "backend", "server", "--port", str(port)], env=env, cwd=ROOT
    )
    import urllib.request

    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("vigil server did not start")


def run_config(name: str, args: argparse.Namespace, endpoint: str, workdir: Path) -> dict:
    out = workdir / f"{name}.json"
    env = {**os.environ, **MALLOC_ENV, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        __file__,
        "--rank-main",
        "--config",
        name,
        "--endpoint",
        endpoint,
        "--out",
        str(out),
        "--blocks",
        str(args.blocks),
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--clock",
        args.clock,
    ]
    print(
        f"[{name}] {args.blocks} blocks x {len(MODES)} modes x {args.steps} steps ...", flush=True
    )
    subprocess.run(command, env=env, check=True, cwd=ROOT)
    times = json.loads(out.with_suffix(".rank0.json").read_text())
    median = {m: statistics.median(v) for m, v in times.items()}
    bare = median["bare"]
    result = {
        "config": name,
        **CONFIGS[name],
        "clock": args.clock,
        "steps_per_mode": len(times["bare"]),
    }
    for mode in MODES:
        result[f"{mode}_ms"] = round(median[mode] * 1000, 3)
        result[f"{mode}_overhead_pct"] = round((median[mode] / bare - 1) * 100, 2)
    added = {m: median[m] - bare for m in MODES}
    for mode in ("defaults", "opseq"):
        ratio = added["profiler"] / added[mode] if added[mode] > 0 else float("inf")
        result[f"profiler_vs_{mode}"] = round(ratio, 1) if ratio != float("inf") else "inf"
    return result


def print_table(results: list[dict]) -> None:
    print(f"\n{'config':9} {'mode':9} {'median ms':>10} {'vs bare':>9}")
    for r in results:
        for mode in MODES:
            print(
                f"{r['config']:9} {mode:9} {r[f'{mode}_ms']:>10.3f} "
                f"{r[f'{mode}_overhead_pct']:>+8.2f}%"
            )
        print(
            f"{r['config']:9} profiler adds {r['profiler_vs_defaults']}x the time of the "
            f"defaults and {r['profiler_vs_opseq']}x that of capture-every-step"
        )
    print("\ntargets: defaults <= 2%, opseq every step <= 5%, profiler >= 10x the added time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=[*CONFIGS, "all"], default="all")
    parser.add_argument("--blocks", type=int, default=8, help="rounds of the five modes")
    parser.add_argument("--steps", type=int, default=10, help="steps per block")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="step time as wall time, or as the training thread's CPU time",
    )
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--json", type=Path, help="also write the results here")
    # Internal: how torchrun starts each rank.
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_main:
        rank_main(args)
        return
    names = list(CONFIGS) if args.config == "all" else [args.config]
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(args.port, Path(tmp) / "bench.db")
        try:
            results = [
                run_config(n, args, f"http://127.0.0.1:{args.port}", Path(tmp)) for n in names
            ]
        finally:
            server.terminate()
            server.wait(10)
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

"""What the per-step shape fingerprint costs a training step, in one process.

``bench/collector_overhead.py`` measures the whole collector under 2-rank DDP; this isolates
the shape fingerprint (``collector/integrations/shape_fp.py``) on the same models, without
DDP, a server or threads, so its small cost is not lost in their noise. Three modes run in
interleaved blocks (shuffled, the first step of each block dropped):

- ``bare``       no global module hooks;
- ``idle``       the hooks registered, no step recording (what a process pays between steps,
                 and what a ``vigil.step`` outside the collector's steps pays);
- ``recording``  the hooks recording every module call and the fingerprint hashed at the
                 step's end, as on every step at the defaults.

Step times are the thread's CPU time (``time.thread_time``) and wall time; medians.

    python bench/shape_fingerprint.py                   # both configurations
    python bench/shape_fingerprint.py --config gpt --blocks 6
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.collector_overhead import CONFIGS  # noqa: E402

MODES = ("bare", "idle", "recording")


def run(name: str, blocks: int, steps: int) -> dict[str, float | int | str]:
    import torch
    from torch.nn import functional as F

    from collector.integrations.shape_fp import RECORDER
    from examples.train_tiny_gpt import TinyGPT

    cfg = CONFIGS[name]
    torch.manual_seed(0)
    model = TinyGPT(cfg["vocab"], cfg["dim"], cfg["layers"], cfg["heads"], cfg["seq"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1))
    calls = 0

    def step(mode: str) -> tuple[float, float]:
        nonlocal calls
        cpu, wall = time.thread_time(), time.perf_counter()
        if mode == "recording":
            RECORDER.start()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg["vocab"]), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if mode == "recording":
            assert RECORDER.stop()
            calls = RECORDER.calls
        return time.thread_time() - cpu, time.perf_counter() - wall

    for _ in range(5):
        step("bare")
    order = random.Random(42)
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    wall: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(blocks):
        modes = list(MODES)
        order.shuffle(modes)
        for mode in modes:
            if mode == "bare":
                RECORDER.uninstall()
            else:
                RECORDER.install()
            block = [step(mode) for _ in range(steps)][1:]
            cpu[mode] += [c for c, _ in block]
            wall[mode] += [w for _, w in block]
    RECORDER.uninstall()
    result: dict[str, float | int | str] = {"config": name, "module_calls": calls}
    bare_cpu = statistics.median(cpu["bare"])
    for mode in MODES:
        result[f"{mode}_cpu_ms"] = round(statistics.median(cpu[mode]) * 1e3, 3)
        result[f"{mode}_wall_ms"] = round(statistics.median(wall[mode]) * 1e3, 3)
        result[f"{mode}_cpu_pct"] = round((statistics.median(cpu[mode]) / bare_cpu - 1) * 100, 2)
    added = statistics.median(cpu["recording"]) - bare_cpu
    result["us_per_module_call"] = round(added / max(calls, 1) * 1e6, 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=[*CONFIGS, "all"], default="all")
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    names = list(CONFIGS) if args.config == "all" else [args.config]
    print(f"{'config':9} {'mode':10} {'cpu ms':>8} {'vs bare':>8} {'wall ms':>8}")
    for name in names:
        r = run(name, args.blocks, args.steps)
        for mode in MODES:
            print(
                f"{name:9} {mode:10} {r[f'{mode}_cpu_ms']:>8} {r[f'{mode}_cpu_pct']:>+7}% "
                f"{r[f'{mode}_wall_ms']:>8}"
            )
        calls, each = r["module_calls"], r["us_per_module_call"]
        print(f"{name:9} {calls} module calls a step, {each} µs each")


if __name__ == "__main__":
    main()

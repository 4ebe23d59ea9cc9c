"""Swap policy vs the baselines on captured profiles, generator time, executor cost.

From the repository root::

    .venv/bin/python bench/swap_policy.py                  # the table in bench/README.md
    .venv/bin/python bench/swap_policy.py --budget 0.5 --bandwidth 1.2e10 --bandwidth 2e8
    .venv/bin/python bench/swap_policy.py --part executor  # only 4. (and 5. on a GPU)

1. **Profiles.** Real steps captured with ``collector.integrations.profile.capture_profile``
   (after a warm-up step and a warm-up capture): the tests' tiny GPT
   (``tests/collector/tiny_models.py``, dim 64, 4 layers, batch 8) at sequence lengths 32
   and 128, and an MLP (6 × Linear(512)+GELU, batch 256). CPU op times, so the "device"
   is the CPU and the bandwidth is a parameter.
2. **Table.** For each profile, bandwidth and budget (``--budget``: the fraction of the
   saved-activation memory that may stay, on top of parameters, gradients and optimizer
   state): the generated policy, then the three baselines, each replayed by the simulator:
   peak bytes, exposed transfer time, estimated step time.
3. **Generator time** on the profiles and on synthetic 10,000-op sequences
   (``tests/detectors/swap_profiles.random_profile``), budgets 90/60/30 %, median of
   ``--repeat`` runs (no warm-up cache: each call starts from the dict).
4. **Executor cost** on CPU: the tiny GPT's step (seq 128) bare, accounted without a
   policy (what ``VIGIL_SWAP=1`` costs every step on CPU: ``collector.integrations.swap_loop``),
   with a policy that offloads nothing (hooks only) and with one that offloads everything
   (real copies), median of ``--steps`` steps, and the measured peak against the simulator's.
5. **On CUDA**, when there is a device: the same step on the GPU (seq 512, batch 16) bare,
   under a policy for half the activations and under offload-everything (pinned host
   buffers, a side stream: ``collector/integrations/swap_cuda.py``): median step time and the
   allocator's real peak (``torch.cuda.max_memory_allocated``), with the policy's predicted
   peak. Without a device it says so and skips.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.append(str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn

from collector.integrations.profile import capture_profile
from collector.integrations.swap import SwapExecutor
from detectors.swap import baselines, generate, offload_everything, simulate
from tests.collector.tiny_models import TinyGPT, batch
from tests.detectors.swap_profiles import random_profile


def gpt_step(seq: int, device: str = "cpu", size: int = 8) -> tuple[nn.Module, Callable[[], None]]:
    torch.manual_seed(0)
    model = TinyGPT(dim=64, layers=4).to(device)
    tokens = batch(seq, size=size).to(device)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1])
        nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()

    return model, step


def mlp_step() -> tuple[nn.Module, Callable[[], None]]:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(6):
        layers += [nn.Linear(512, 512), nn.GELU()]
    model = nn.Sequential(*layers)
    x = torch.randn(256, 512)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(x).square().mean().backward()

    return model, step


def capture(model: nn.Module, step: Callable[[], None]) -> dict[str, Any]:
    step()  # warm-up: the model, and the profiler's first-use costs
    capture_profile(step, module=model)
    return capture_profile(step, module=model)


def fmt_bytes(n: float) -> str:
    return f"{n / 1024:,.0f} KiB"


def table(profiles: dict[str, dict[str, Any]], budgets: list[float], bws: list[float]) -> None:
    print("| profile | bandwidth | budget | plan | peak | exposed | step | offloaded |")
    print("|---|---|---|---|---|---|---|---|")
    for name, prof in profiles.items():
        base = prof["param_bytes"] + prof["grad_bytes"] + prof["optimizer_bytes"]
        for bw in bws:
            rows = baselines(prof, bw)
            none = rows["no offload"].peak_bytes
            for frac in budgets:
                budget = int(base + frac * (none - base))
                pol = generate(prof, budget_bytes=budget, bandwidth_bytes_per_s=bw)
                ok = "" if pol["feasible"] else " (infeasible)"
                plan = [("**policy**" + ok, simulate(prof, pol, bandwidth_bytes_per_s=bw))]
                plan += list(rows.items())
                for label, r in plan:
                    n = (
                        f"{len(pol['offload'])}/{len(pol['storage_bytes'])}"
                        if "policy" in label
                        else ""
                    )
                    print(
                        f"| {name} | {bw:.1e} B/s | {fmt_bytes(budget)} | {label} | "
                        f"{fmt_bytes(r.peak_bytes)} | {r.exposed_s * 1e3:.3f} ms | "
                        f"{r.step_s * 1e3:.2f} ms | {n} |"
                    )


def gen_time(prof: dict[str, Any], frac: float, bw: float, repeat: int) -> tuple[float, bool]:
    base = prof["param_bytes"] + prof["grad_bytes"] + prof["optimizer_bytes"]
    none = simulate(prof, None, bandwidth_bytes_per_s=bw).peak_bytes
    budget = int(base + frac * (none - base))
    times = []
    feasible = False
    for _ in range(repeat):
        t0 = time.perf_counter()
        pol = generate(prof, budget_bytes=budget, bandwidth_bytes_per_s=bw)
        times.append(time.perf_counter() - t0)
        feasible = pol["feasible"]
    return statistics.median(times), feasible


def executor_cost(steps: int) -> None:
    model, step = gpt_step(128)
    prof = capture(model, step)
    nothing = generate(prof, budget_bytes=10**15, bandwidth_bytes_per_s=1e10)
    everything = offload_everything(prof, bandwidth_bytes_per_s=1e10)
    n_saved = len(prof["saved"])
    print(
        f"\nexecutor on CPU, tiny GPT seq 128: {n_saved} saved tensors, "
        f"{len(everything['storage_bytes'])} storages"
    )
    print("| mode | median step | vs bare | measured peak | simulator (inf. bandwidth) |")
    print("|---|---|---|---|---|")
    modes = {
        "bare": None,
        "accounted, no policy (VIGIL_SWAP=1)": None,
        "policy, nothing offloaded": nothing,
        "policy, everything offloaded": everything,
    }
    executors = {label: SwapExecutor(account="accounted" in label) for label in modes}
    base = prof["param_bytes"] + prof["grad_bytes"] + prof["optimizer_bytes"]
    for label, pol in modes.items():
        executors[label].set_policy(pol)
        executors[label].base_bytes = base
    times = interleaved(executors, step, steps)
    bare = statistics.median(times["bare"])
    for label, pol in modes.items():
        med = statistics.median(times[label])
        last = executors[label].last
        peak = last["peak_bytes"] if last and last["peak_bytes"] is not None else None
        pred = simulate(prof, pol, bandwidth_bytes_per_s=math.inf).peak_bytes
        print(
            f"| {label} | {med * 1e3:.2f} ms | {100 * (med / bare - 1):+.1f}% | "
            f"{fmt_bytes(peak) if peak is not None else '—'} | {fmt_bytes(pred)} |"
        )


def interleaved(
    executors: dict[str, SwapExecutor], step: Callable[[], None], steps: int, sync: bool = False
) -> dict[str, list[float]]:
    """Step times per executor, interleaved so that a busy machine slows every mode alike."""
    times: dict[str, list[float]] = {label: [] for label in executors}
    for _ in range(steps):
        for label, ex in executors.items():
            t0 = time.perf_counter()
            with ex.step():
                step()
            if sync:
                torch.cuda.synchronize()
            times[label].append(time.perf_counter() - t0)
    return times


def cuda_cost(steps: int) -> None:
    """5.: real peak memory and step time on the GPU, bare and under two policies."""
    if not torch.cuda.is_available():
        print("\nCUDA: no device on this machine; the GPU rows are skipped")
        return
    model, step = gpt_step(512, device="cuda", size=16)
    prof = capture(model, step)
    base = prof["param_bytes"] + prof["grad_bytes"] + prof["optimizer_bytes"]
    none = simulate(prof, None, bandwidth_bytes_per_s=1.2e10).peak_bytes
    policies = {
        "bare": None,
        "policy, half the activations": generate(
            prof, budget_bytes=int(base + 0.5 * (none - base)), bandwidth_bytes_per_s=1.2e10
        ),
        "policy, everything offloaded": offload_everything(prof, bandwidth_bytes_per_s=1.2e10),
    }
    print(f"\nCUDA ({torch.cuda.get_device_name()}), tiny GPT seq 512 batch 16")
    print("| mode | median step | vs bare | allocator peak | predicted peak (model) |")
    print("|---|---|---|---|---|")
    executors = {label: SwapExecutor() for label in policies}
    for label, pol in policies.items():
        executors[label].set_policy(pol)
    peaks: dict[str, int] = {}
    for label, ex in executors.items():  # one step each on its own, for its peak
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        with ex.step():
            step()
        torch.cuda.synchronize()
        peaks[label] = int(torch.cuda.max_memory_allocated())
    times = interleaved(executors, step, steps, sync=True)
    bare = statistics.median(times["bare"])
    for label, pol in policies.items():
        med = statistics.median(times[label])
        pred = simulate(prof, pol, bandwidth_bytes_per_s=1.2e10).peak_bytes
        print(
            f"| {label} | {med * 1e3:.2f} ms | {100 * (med / bare - 1):+.1f}% | "
            f"{fmt_bytes(peaks[label])} | {fmt_bytes(pred)} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, action="append", help="fraction (repeatable)")
    ap.add_argument("--bandwidth", type=float, action="append", help="bytes/s (repeatable)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--part", choices=("all", "executor"), default="all")
    args = ap.parse_args()
    budgets = args.budget or [0.5, 0.2]
    bws = args.bandwidth or [1.2e10, 2e8]
    torch.set_num_threads(1)
    print(
        f"# {platform.node()} {platform.processor() or platform.machine()}, "
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    if args.part == "executor":
        executor_cost(args.steps)
        cuda_cost(args.steps)
        return
    profiles = {
        "gpt seq 32": capture(*gpt_step(32)),
        "gpt seq 128": capture(*gpt_step(128)),
        "mlp": capture(*mlp_step()),
    }
    for name, prof in profiles.items():
        print(
            f"{name}: {len(prof['ops'])} ops, {len(prof['saved'])} saved tensors, "
            f"step {prof['step_s'] * 1e3:.1f} ms (profiled)"
        )
    print()
    table(profiles, budgets, bws)
    print("\n| sequence | ops | budget | generator (median) | feasible |")
    print("|---|---|---|---|---|")
    synthetic = {f"synthetic seed {s}": random_profile(10_000, seed=s) for s in (0, 1)}
    for name, prof in {**profiles, **synthetic}.items():
        for frac in (0.9, 0.6, 0.3):
            t, ok = gen_time(prof, frac, 1.2e10, args.repeat)
            print(f"| {name} | {len(prof['ops']):,} | {frac:.0%} | {t * 1e3:.1f} ms | {ok} |")
    executor_cost(args.steps)
    cuda_cost(args.steps)


if __name__ == "__main__":
    main()

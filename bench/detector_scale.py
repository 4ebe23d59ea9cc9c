"""Detector cost at scale: every detector over one window of 16,384 ranks × 200 steps, one core.

From the repository root::

    .venv/bin/python bench/detector_scale.py                 # 16,384 ranks, median of 7 runs
    .venv/bin/python bench/detector_scale.py --ranks 4096 --repeat 11 --cpu 1

The window comes from ``bench/simulate.py``: a synchronous job of 16,384 ranks in 2,048
tensor-parallel groups of 8 (tp all-reduce family: 2,048 groups × 8 members × 200 steps) and
8 data-parallel groups of 2,048 (dp family: 8 × 2,048 × 200), with a straggler, a slow link,
a loss spike and a memory leak injected so that every detector also does its per-finding
work. Arrays are what the backend hands the detectors: float64 ``(R, S)`` per-step series
and float32 collective durations.

Timed, each as the median of ``--repeat`` runs after one warm-up:

- the window detectors: ``detect_stragglers``, ``detect_numerics``, ``detect_slowdown``,
  ``detect_comm``, ``detect_memory`` — their sum is held against the < 200 ms target;
- the hang/crash sweep (``hang.detect``) on 16,384 rank states, healthy and hung (the
  hung case builds the wait-for graph and finds the culprits), reported beside it: it is not
  a window detector but runs every few seconds on the same job;
- the straggler detector alone on windows with no rank slow and with ``--slow-share`` (25%)
  of the ranks 1.2x slower for the last 80 steps (a group straggler: every slow rank is
  named, so this is the cost of building thousands of findings), beside the window above
  with its one straggler.

**One core.** The BLAS/OpenMP thread pools are limited to one thread (``OMP_NUM_THREADS``,
``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``, ``VECLIB_MAXIMUM_THREADS``,
``NUMEXPR_NUM_THREADS`` = 1, set below before numpy is imported; a value already in the
environment is kept), and the process is pinned to one CPU with
``os.sched_setaffinity(0, {cpu})`` where the platform has it (Linux; ``--cpu``, default the
first CPU this process may use). On a machine shared with other work the figures are upper
bounds: run it twice and take the lower.
"""

from __future__ import annotations

import os

for _var in (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
):
    os.environ.setdefault(_var, "1")  # must precede the first import of numpy

import argparse  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

if __package__ in (None, ""):  # run as a script: make the repository root importable
    # Appended, so that a PYTHONPATH entry (another checkout's detectors) still comes first.
    sys.path.append(str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench.simulate import (  # noqa: E402
    MIB,
    Fault,
    JobConfig,
    Run,
    rank_states,
    recent_step_durations,
    simulate,
)
from detectors import comm, hang, memory, numerics, slowdown, straggler  # noqa: E402

TARGET_MS = 200.0


def pin(cpu: int | None) -> str:
    """Pin this process to one CPU; return a description of what was done."""
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned (no sched_setaffinity on this platform)"
    allowed = sorted(os.sched_getaffinity(0))
    chosen = allowed[0] if cpu is None else cpu
    os.sched_setaffinity(0, {chosen})
    return f"pinned to CPU {chosen} (of {len(allowed)} allowed)"


def build_group(ranks: int, steps: int, seed: int, share: float) -> Run:
    """A window with ``share`` of the ranks (evenly spread) 1.2x slower for its last 80
    steps, and nothing else; ``share=0``: a clean window."""
    cfg = JobConfig(ranks=ranks, steps=steps, seed=seed, step_s=0.5)
    n_slow = round(share * ranks)
    slow = np.linspace(0, ranks - 1, n_slow).astype(int) if n_slow else []
    return simulate(cfg, [Fault("straggler", (int(r),), steps - 80, magnitude=1.2) for r in slow])


def build(ranks: int, steps: int, seed: int) -> tuple[Run, Run]:
    """A faulty window (every detector has something to report) and a hung job."""
    cfg = JobConfig(ranks=ranks, steps=steps, seed=seed, step_s=0.5)
    faults = [
        Fault("straggler", (ranks - 39,), onset_step=steps - 80, magnitude=1.3),
        Fault("slow_link", (ranks // 3,), onset_step=steps - 60, magnitude=3.0),
        Fault("loss_spike", (), onset_step=steps - 30, duration=5, magnitude=0.5),
        Fault("memory_leak", (7,), onset_step=steps - 50, magnitude=64 * MIB),
    ]
    window = simulate(cfg, faults)
    hung = simulate(cfg, [Fault("hang", (ranks // 2 + 3,), onset_step=steps - 1, variant="idle")])
    return window, hung


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Median wall time in ms over ``repeat`` runs after one warm-up; the last result."""
    result = fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(1e3 * (time.perf_counter() - start))
    return float(np.median(times)), result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=16384, help="ranks (multiple of 8)")
    p.add_argument("--steps", type=int, default=200, help="steps in the window")
    p.add_argument("--repeat", type=int, default=7, help="timed runs per detector (median)")
    p.add_argument("--cpu", type=int, default=None, help="CPU to pin to (default: first)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--slow-share", type=float, default=0.25, help="share of ranks slow in the group case"
    )
    args = p.parse_args(argv)

    pinned = pin(args.cpu)
    threads = ", ".join(f"{v}={os.environ[v]}" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"))
    print(
        f"detector scale: {args.ranks:,} ranks × {args.steps} steps, median of {args.repeat} "
        f"runs; {pinned}; {threads}"
    )
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}")
    t0 = time.perf_counter()
    run, hung = build(args.ranks, args.steps, args.seed)
    families = run.families()
    groups = run.groups()
    g_tp, m_tp = families[0].members.shape
    g_dp, m_dp = families[1].members.shape
    print(
        f"window built in {time.perf_counter() - t0:.1f} s: tp family {g_tp} groups × {m_tp}, "
        f"dp family {g_dp} groups × {m_dp}; float64 series, float32 collective durations"
    )

    steps = run.steps
    cap = run.capacity_bytes()
    window: list[tuple[str, Callable[[], Any]]] = [
        ("straggler", lambda: straggler.detect_stragglers(steps, run.step_time, run.comm_time)),
        ("numerics", lambda: numerics.detect_numerics(run.loss, run.grad_norm, steps=steps)),
        (
            "slowdown",
            lambda: slowdown.detect_slowdown(
                run.step_time, run.comm_time, run.data_time, steps=steps
            ),
        ),
        ("comm", lambda: comm.detect_comm(families, steps=steps)),
        ("memory", lambda: memory.detect_memory(run.mem_bytes, cap, steps=steps)),
    ]
    # Hang sweeps: a healthy job mid-step, and a hung one (culprit attribution over 16k ranks).
    now_ok = float(run.step_start[-1] + 0.5 * (run.step_end[-1] - run.step_start[-1]))
    states_ok = rank_states(run, now_ok)
    dur_ok = recent_step_durations(run)
    now_hung = hung.last_progress + 60.0
    states_hung = rank_states(hung, now_hung)
    dur_hung = recent_step_durations(hung)
    sweeps: list[tuple[str, Callable[[], Any]]] = [
        (
            "hang sweep, healthy",
            lambda: hang.detect(states_ok, now=now_ok, step_durations=dur_ok, groups=groups),
        ),
        (
            "hang sweep, hung",
            lambda: hang.detect(states_hung, now=now_hung, step_durations=dur_hung, groups=groups),
        ),
    ]

    print("")
    print(f"{'detector':<22}{'ms':>9}  findings")
    total = 0.0
    for name, fn in window:
        ms, found = timed(fn, args.repeat)
        total += ms
        print(f"{name:<22}{ms:>9.1f}  {_describe(found)}")
    print(f"{'window detectors total':<22}{total:>9.1f}")
    worst_sweep = 0.0
    for name, fn in sweeps:
        ms, found = timed(fn, args.repeat)
        worst_sweep = max(worst_sweep, ms)
        print(f"{name:<22}{ms:>9.1f}  {_describe(found)}")
    everything = total + worst_sweep
    print("")
    print("straggler detector alone, by ranks slow (1.2x for the last 80 steps):")
    for share in (0.0, args.slow_share):
        group = build_group(args.ranks, args.steps, args.seed, share)
        ms, found = timed(
            lambda g=group: straggler.detect_stragglers(g.steps, g.step_time, g.comm_time),
            args.repeat,
        )
        label = "none slow" if share == 0 else f"{round(share * args.ranks):,} slow ({share:.0%})"
        print(f"  {label:<20}{ms:>9.1f}  {len(found):,} findings")
    print("")
    for label, ms in (
        ("window detectors", total),
        ("window detectors + the slower hang sweep", everything),
    ):
        verdict = "PASS" if ms < TARGET_MS else "FAIL"
        print(
            f"{verdict}  {label} over {args.ranks:,} ranks × {args.steps} steps: {ms:.1f} ms "
            f"(target < {TARGET_MS:.0f} ms on one core)"
        )
    return 0


def _describe(findings: Any) -> str:
    out = []
    for f in findings:
        ranks = f.ranks if len(f.ranks) <= 4 else f"{len(f.ranks)} ranks"
        out.append(f"{f.key} {ranks}")
    return "; ".join(out) or "none"


if __name__ == "__main__":
    sys.exit(main())

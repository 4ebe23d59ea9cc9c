"""Clean real jobs on a busy host: how many incidents does Vigil open when nothing is wrong?

Real training (``examples/train_tiny_gpt.py``: DDP over gloo on CPU, launched with
``vigil run -- torchrun``) reporting to a real embedded Vigil (SQLite, detection every
``--detect-interval`` seconds as in production), while competing processes of our own burn
the CPU: ``--burners`` processes, each alternating busy and idle spells of random length
(50 ms – 2 s busy, 0 – 1 s idle), so the job's steps are slowed unevenly all the time, as
on a shared 2-core machine. Each clean run is a new job name; every incident it gets is a
false alarm. Then a few runs with faults injected by ``--chaos`` (``VIGIL_CHAOS``), each
of which must be found with the right kind and ranks, under the same contention:

- ``straggler``: rank 1 sleeps ``+straggler_s`` in every step from step 200 (→ ``straggler``
  naming rank 1, on a 2-rank job: the rank that waits least);
- ``slowdown``: every rank sleeps ``+slowdown_s`` per step from step 200 (→ ``slowdown``);
- ``nan``: the gradients turn NaN at step 200 (→ ``nan``);
- ``hang``: rank 1 stops before step 200 (→ ``hang`` naming rank 1); the job is then killed.

From the repository root::

    .venv/bin/python bench/clean_runs.py                       # 10 clean runs + 4 faults
    .venv/bin/python bench/clean_runs.py --runs 3 --steps 600 --faults straggler
    .venv/bin/python bench/clean_runs.py --burners 0           # no contention (reference)

Exit status 0 when the targets hold: 0 incidents over the clean runs, every fault found.
The machine's other load (other users, other jobs) adds to the competitors: say so with
the figures.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

EXAMPLE = ROOT / "examples" / "train_tiny_gpt.py"
FAULT_STEP = 200
# fault name -> (chaos spec, expected incident kind, expected ranks (None: any))
FAULTS: dict[str, tuple[str, str, tuple[int, ...] | None]] = {
    "straggler": ("straggler:rank=1,from_step={at},delay_s={straggler_s}", "straggler", (1,)),
    "slowdown": ("straggler:from_step={at},delay_s={slowdown_s}", "slowdown", None),
    "nan": ("nan:at_step={at}", "nan", None),
    "hang": ("hang:rank=1,at_step={at}", "hang", (1,)),
}


def burn(seed: int, stop: Any) -> None:
    """A competitor: busy and idle spells of random length until ``stop`` is set."""
    rng = random.Random(seed)
    while not stop.is_set():
        until = time.perf_counter() + rng.uniform(0.05, 2.0)
        x = 0
        while time.perf_counter() < until:
            x += 1
        stop.wait(rng.uniform(0.0, 1.0))


@dataclass
class Result:
    name: str
    job: str
    fault: str | None
    returncode: int | None
    wall_s: float
    steps: int
    step_p50_s: float
    step_p95_s: float
    incidents: list[dict[str, Any]] = field(default_factory=list)

    def found(self) -> bool:
        if self.fault is None:
            return False
        _, kind, ranks = FAULTS[self.fault]
        return any(
            i["kind"] == kind
            and (ranks is None or tuple(i["ranks"]) == ranks)
            and (i["first_step"] is None or i["first_step"] >= FAULT_STEP - 10)
            for i in self.incidents
        )

    def stray(self) -> list[dict[str, Any]]:
        """Incidents that are not the injected fault nor a consequence linked to it."""
        if self.fault is None:
            return self.incidents
        _, kind, ranks = FAULTS[self.fault]
        return [
            i
            for i in self.incidents
            if not (i["kind"] == kind and (ranks is None or tuple(i["ranks"]) == ranks))
            and not i["evidence"].get("consequence_of")
            and not (self.fault == "hang" and i["kind"] in ("hang", "crash"))
        ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(
    base: str, token: str, job: str, args: argparse.Namespace, chaos: str | None
) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "backend", "run", "--job", job, "--endpoint", base]
    command += ["--token", token]
    if chaos:
        command += ["--chaos", chaos]
    command += [
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(args.ranks),
        str(EXAMPLE),
        "--steps",
        str(args.steps),
        "--dim",
        str(args.dim),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        command,
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def one_run(
    api: httpx.Client, base: str, token: str, name: str, fault: str | None, args: argparse.Namespace
) -> Result:
    from backend.launch import kill_tree

    job = f"{name}-{time.strftime('%H%M%S')}"
    chaos = None
    if fault is not None:
        chaos = FAULTS[fault][0].format(
            at=FAULT_STEP, straggler_s=args.straggler_s, slowdown_s=args.slowdown_s
        )
    started = time.monotonic()
    proc = launch(base, token, job, args, chaos)
    rc: int | None = None
    try:
        if fault == "hang":  # runs until the hang is found (or the budget is spent)
            deadline = time.monotonic() + args.timeout
            while time.monotonic() < deadline and proc.poll() is None:
                if any(i["kind"] == "hang" for i in _incidents(api, job)):
                    break
                time.sleep(1.0)
        else:
            proc.communicate(timeout=args.timeout)
            rc = proc.returncode
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()
    wall = time.monotonic() - started
    time.sleep(args.settle)  # the last batches land and detection runs on them
    steps = _steps(api, job)
    if args.save:
        Path(args.save).mkdir(parents=True, exist_ok=True)
        Path(args.save, f"{job}.json").write_text(json.dumps(steps))
    times = sorted(s["duration_s"] for s in steps if s.get("duration_s") is not None)
    return Result(
        name=name,
        job=job,
        fault=fault,
        returncode=rc,
        wall_s=wall,
        steps=len({s["step"] for s in steps}),
        step_p50_s=_pct(times, 0.5),
        step_p95_s=_pct(times, 0.95),
        incidents=_incidents(api, job),
    )


def _steps(api: httpx.Client, job: str) -> list[dict[str, Any]]:
    """Every step record of the job (following the cursor)."""
    items: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 10_000}
    while True:
        reply = api.get(f"/jobs/{job}/steps", params=params)
        if reply.status_code != 200:
            return items
        page = reply.json()
        items += page.get("items", [])
        if not page.get("next_cursor"):
            return items
        params["cursor"] = page["next_cursor"]


def _incidents(api: httpx.Client, job: str) -> list[dict[str, Any]]:
    reply = api.get(f"/jobs/{job}/incidents")
    return list(reply.json()) if reply.status_code == 200 else []


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def _describe(i: dict[str, Any]) -> str:
    link = i["evidence"].get("consequence_of")
    tail = f", consequence of #{link}" if link else ""
    return (
        f"#{i['id']} {i['kind']} ranks={i['ranks']} first_step={i['first_step']} "
        f"{i['status']}{tail}: {i['summary'][:110]}"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10, help="clean runs (10)")
    p.add_argument("--steps", type=int, default=600, help="steps per run (600)")
    p.add_argument("--ranks", type=int, default=2, help="ranks per job (2, README's example)")
    p.add_argument("--dim", type=int, default=128, help="model width (128, the example's)")
    p.add_argument("--burners", type=int, default=2, help="competing CPU-burning processes (2)")
    p.add_argument(
        "--faults",
        nargs="*",
        default=list(FAULTS),
        choices=list(FAULTS),
        help="fault runs after the clean ones (default: all)",
    )
    p.add_argument("--straggler-s", type=float, default=0.03, help="straggler delay per step")
    p.add_argument("--slowdown-s", type=float, default=0.25, help="job-wide delay per step")
    p.add_argument("--detect-interval", type=float, default=2.0, help="seconds (production: 2)")
    p.add_argument(
        "--window-steps", type=int, default=200, help="detection window (VIGIL_DETECT_WINDOW_STEPS)"
    )
    p.add_argument("--settle", type=float, default=8.0, help="seconds after a run ends")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run at most")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", metavar="DIR", help="write each run's step records here (JSON)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from backend.demo.server import embedded_server

    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    burners = [
        ctx.Process(target=burn, args=(args.seed * 100 + i, stop), daemon=True)
        for i in range(args.burners)
    ]
    results: list[Result] = []
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="vigil-clean-runs-") as tmp:
        url = f"sqlite:///{tmp}/vigil.db"
        with embedded_server(
            database_url=url,
            port=free_port(),
            detect_interval_s=args.detect_interval,
            sweep_interval_s=args.detect_interval,
            detect_window_steps=args.window_steps,
        ) as vigil:
            admin = {"Authorization": f"Bearer {vigil.token('admin')}"}
            for b in burners:
                b.start()
            try:
                with httpx.Client(
                    base_url=f"{vigil.base}/api/v1", headers=admin, timeout=30
                ) as api:
                    plan = [(f"clean-{i:02d}", None) for i in range(args.runs)]
                    plan += [(f"fault-{f}", f) for f in args.faults]
                    for name, fault in plan:
                        r = one_run(api, vigil.base, vigil.token("ingest"), name, fault, args)
                        results.append(r)
                        _print_run(r)
            finally:
                stop.set()
                for b in burners:
                    b.join(5)
    return _report(results, args, t0)


def _print_run(r: Result) -> None:
    verdict = ""
    if r.fault is not None:
        verdict = "FOUND" if r.found() else "MISSED"
    print(
        f"{r.name:<16} rc={r.returncode} {r.wall_s:6.1f} s  steps={r.steps}  "
        f"step p50/p95 {1e3 * r.step_p50_s:.0f}/{1e3 * r.step_p95_s:.0f} ms  "
        f"incidents={len(r.incidents)} {verdict}",
        flush=True,
    )
    for i in r.incidents:
        print(f"    {_describe(i)}", flush=True)


def _report(results: list[Result], args: argparse.Namespace, t0: float) -> int:
    clean = [r for r in results if r.fault is None]
    faults = [r for r in results if r.fault is not None]
    false_alarms = sum(len(r.incidents) for r in clean)
    steps = sum(r.steps for r in clean)
    print("")
    print(
        f"Clean runs under contention — {len(clean)} runs × {args.steps} steps, "
        f"{args.ranks} ranks, {args.burners} burners, detection every {args.detect_interval} s "
        f"over {args.window_steps} steps; "
        f"{platform.node()} ({os.cpu_count()} CPUs), "
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(t0))} UTC, {time.time() - t0:.0f} s"
    )
    by_kind: dict[str, int] = {}
    for r in clean:
        for i in r.incidents:
            by_kind[i["kind"]] = by_kind.get(i["kind"], 0) + 1
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(by_kind.items())) or "none"
    print(f"  incidents on clean runs: {false_alarms} over {steps:,} job steps ({kinds})")
    found = sum(r.found() for r in faults)
    stray = sum(len(r.stray()) for r in faults)
    for r in faults:
        print(
            f"  fault {r.fault:<10} {'found' if r.found() else 'MISSED'}; "
            f"other incidents {len(r.stray())}"
        )
    ok_clean, ok_faults = false_alarms == 0, found == len(faults)
    print(f"  {'PASS' if ok_clean else 'FAIL'}  0 incidents on clean runs ({false_alarms})")
    print(
        f"  {'PASS' if ok_faults else 'FAIL'}  every injected fault found "
        f"({found} of {len(faults)}; unrelated incidents in fault runs: {stray})"
    )
    return 0 if ok_clean and ok_faults else 1


if __name__ == "__main__":
    sys.exit(main())

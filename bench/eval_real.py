"""The detection evaluation's real cases (``bench/detection_eval.py`` prints them).

- **PAI job_1** (``tests/data/pai_minibatch``): 10 workers, 300 samples of 10 iterations;
  replayed in order with a detection run after every sample, sliding 200-sample windows and
  carried baselines, as the backend runs it. Truth: worker 6 from the first sample in
  1800–2000 at which it is 1.3× the median (iteration 1811); workers 0–2, about 10% slower
  throughout, are not stragglers.
- **Flight Recorder** ``lock_gil_1st`` (``tests/data/flight_recorder``): 16 ranks' dumps of
  a real hang; culprits {9, 14}.
- **Kineto** ``gloo_ddp_4ranks_straggler`` (``tests/data/kineto``): four ranks' profiler
  traces of a gloo DDP job, read with ``backend.importers.kineto_trace.read_trace``; rank 2
  sleeps 1 s in its forward pass from iteration 6. Judged as an import is: one detection run
  over every iteration once all ranks are in.
- **Pipeline-parallel hangs** (``tests/data/pipeline_hangs``, when there): real hung gloo
  jobs with pipeline stages as the server stored them, through the hang sweep, and, where
  the case has them, its Flight Recorder dumps through the diagnosis; culprits against the
  ranks whose fault struck.

Each case gives a :class:`Case`: what was found, the truth, and whether they agree.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.replay import WINDOW, Outcome, Telemetry, replay

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
PAI_CSV = DATA / "pai_minibatch" / "job_1_norm.csv"
FR_DIR = DATA / "flight_recorder" / "lock_gil_1st"
KINETO_DIR = DATA / "kineto" / "gloo_ddp_4ranks_straggler"
PIPELINE_DIR = DATA / "pipeline_hangs"
ONSET_STEPS = 5  # a real straggler's onset may be dated this many steps (samples) off

__all__ = ["Case", "eval_flight_recorder", "eval_kineto", "eval_pai", "eval_pipeline_hangs"]


@dataclass(frozen=True)
class Case:
    """One real case: ``found`` and ``truth`` as text, ``ok`` when they agree."""

    name: str
    found: str
    truth: str
    ok: bool
    detail: str = ""
    ms: float = 0.0


# --------------------------------------------------------------------------------------------
# Stragglers


def load_pai_job_1() -> tuple[np.ndarray, np.ndarray]:
    """(iterations (300,), times (10 workers, 300)) from the PAI CSV."""
    data = np.genfromtxt(PAI_CSV, delimiter=",", skip_header=1)
    worker = data[:, 1].astype(np.int64)
    iteration = data[:, 3].astype(np.int64)
    iterations = np.unique(iteration)
    times = np.full((int(worker.max()) + 1, iterations.size), np.nan)
    times[worker, np.searchsorted(iterations, iteration)] = data[:, 4]
    return iterations, times


def pai_telemetry(chunk: int = 1) -> Telemetry:
    """PAI job_1 as batches of ``chunk`` samples per worker, with its truth."""
    iterations, times = load_pai_job_1()
    ratio = times / np.median(times, axis=0)
    in_range = (iterations >= 1800) & (iterations <= 2000)
    onset = int(iterations[np.flatnonzero(in_range & (ratio[6] >= 1.3))[0]])
    return Telemetry(
        name="PAI job_1",
        steps=iterations,
        step_time=times,
        comm_time=None,
        chunk=chunk,
        truth=frozenset({6}),
        onset=onset,
    )


def in_order(job: Telemetry) -> list[tuple[int, int, int]]:
    """Every rank's batch of each flush, flush after flush."""
    return [(r, c, c + 1) for c in range(job.n_chunks) for r in range(job.n_ranks)]


def straggler_case(name: str, job: Telemetry, outcome: Outcome, tolerance: int) -> Case:
    """Named ranks against the truth, each onset within ``tolerance`` steps of the truth's."""
    named = sorted(outcome.opened)
    late = {
        r: job.position(outcome.onset(r)) - job.position(job.onset) for r in named if r in job.truth
    }
    ok = set(named) == job.truth and all(abs(d) <= tolerance for d in late.values())
    found = ", ".join(
        f"rank {r} from step {outcome.onset(r)} ({len(outcome.opened[r])} incident(s))"
        for r in named
    )
    return Case(
        name=name,
        found=found or "nothing",
        truth=f"ranks {sorted(job.truth)} from step {job.onset}",
        ok=ok,
        detail=f"onset off by {sorted(set(late.values()))} steps; {outcome.runs} detection runs",
        ms=1e3 * outcome.seconds,
    )


def eval_pai() -> Case:
    """PAI job_1 in order, one detection run per sample (a 200-sample sliding window)."""
    job = pai_telemetry()
    outcome = replay(job, in_order(job), per_run=job.n_ranks, width=WINDOW)
    case = straggler_case("PAI job_1 (carried baselines)", job, outcome, ONSET_STEPS)
    w6 = [a for a in outcome.alerts if a.ranks == (6,)]
    if w6 and w6[0].opened_step is not None:
        lag = w6[0].opened_step - job.onset
        case = Case(
            **{
                **case.__dict__,
                "detail": case.detail + f"; flagged {lag} iterations "
                f"after the onset (1 sample = 10 iterations); workers 0–2 named: "
                f"{sorted(set(outcome.opened) & {0, 1, 2}) or 'none'}",
            }
        )
    return case


def kineto_telemetry(directory: Path = KINETO_DIR) -> Telemetry:
    """The ranks' Kineto traces as rank × iteration arrays (step time, time in collectives)."""
    from backend.importers.kineto_trace import read_trace

    traces = [read_trace(p) for p in sorted(directory.glob("rank-*.json.gz"))]
    steps = np.array(sorted({it.step for t in traces for it in t.iterations}), dtype=np.int64)
    world = max(t.rank for t in traces) + 1
    times = np.full((world, steps.size), np.nan)
    comm = np.full((world, steps.size), np.nan)
    for t in traces:
        for it in t.iterations:
            col = int(np.searchsorted(steps, it.step))
            times[t.rank, col] = it.duration_s
            comm[t.rank, col] = np.nan if it.comm_s is None else it.comm_s
    return Telemetry(
        name="Kineto gloo DDP, 4 ranks",
        steps=steps,
        step_time=times,
        comm_time=comm,
        chunk=int(steps.size),
        truth=frozenset({2}),
        onset=6,
    )


def eval_kineto() -> Case:
    """The 4-rank gloo trace judged as an import is: one run once every rank is in."""
    start = time.perf_counter()
    job = kineto_telemetry()
    read_ms = 1e3 * (time.perf_counter() - start)
    outcome = replay(job, in_order(job), per_run=job.n_ranks)
    case = straggler_case("Kineto gloo_ddp_4ranks_straggler", job, outcome, ONSET_STEPS)
    return Case(**{**case.__dict__, "detail": case.detail + f"; traces read in {read_ms:.0f} ms"})


# --------------------------------------------------------------------------------------------
# Hangs from Flight Recorder dumps


def eval_flight_recorder() -> Case:
    """``lock_gil_1st``: the diagnosis must name exactly ranks 9 and 14."""
    return _fr_case("Flight Recorder lock_gil_1st", FR_DIR, frozenset({9, 14}))


def _fr_case(name: str, directory: Path, truth: frozenset[int]) -> Case:
    from backend.importers.flight_recorder import load_dumps
    from detectors.flight_recorder import analyze

    start = time.perf_counter()
    dumps = load_dumps(directory)
    findings = analyze(dumps)
    ms = 1e3 * (time.perf_counter() - start)
    hangs = [f for f in findings if f.kind == "hang"]
    ok = len(findings) == 1 and len(hangs) == 1 and set(hangs[0].ranks) == truth
    found = "; ".join(f"{f.kind} {sorted(f.ranks)}" for f in findings) or "no finding"
    return Case(
        name=name,
        found=found,
        truth=f"hang, culprits {sorted(truth)}",
        ok=ok,
        detail=f"{len(dumps)} dumps",
        ms=ms,
    )


def eval_pipeline_hangs(directory: Path = PIPELINE_DIR) -> list[Case]:
    """Each recorded case of ``tests/data/pipeline_hangs`` (``<case>/case.json``: what the
    server stored of the hung job, ``server``, and the ranks whose fault struck, ``truth``;
    ``<case>/fr/``: Flight Recorder dumps, when the stages talk through per-pair groups):
    the hang sweep on the stored state, and the Flight Recorder diagnosis of the dumps. []
    when there are no cases."""
    cases = []
    for path in sorted(directory.glob("*/case.json")):
        case = json.loads(path.read_text())
        truth = frozenset(int(r) for r in case["truth"])
        if "server" in case:
            cases.append(_sweep_case(f"pipeline hang {path.parent.name}", case, truth))
        if (path.parent / "fr").is_dir():
            name = f"pipeline hang {path.parent.name}, Flight Recorder"
            cases.append(_fr_case(name, path.parent / "fr", truth))
    return cases


def _sweep_case(name: str, case: dict[str, Any], truth: frozenset[int]) -> Case:
    """The hang/crash sweep as the backend runs it on the stored ranks' state."""
    from detectors.hang import detect
    from tests.detectors.pipeline_hang_cases import rank_states

    server = case["server"]
    start = time.perf_counter()
    findings = detect(
        rank_states(case),
        now=server["now"],
        step_durations=server["step_durations"],
        groups=server["groups"] or None,
        finished=False if server["expect_running"] else None,
    )
    ms = 1e3 * (time.perf_counter() - start)
    ok = len(findings) == 1 and set(findings[0].ranks) == truth
    struck = ", ".join(f"{f['kind']} on {f['rank']}" for f in case.get("faults_struck", []))
    return Case(
        name=name,
        found="; ".join(f"{f.kind} {sorted(f.ranks)}" for f in findings) or "no finding",
        truth=f"culprits {sorted(truth)}",
        ok=ok,
        detail=f"{case.get('world_size', '?')} ranks, {case.get('style', '?')}; {struck}",
        ms=ms,
    )


def eval_all() -> list[Case]:
    """Every real case there is data for."""
    return [eval_pai(), eval_flight_recorder(), eval_kineto(), *eval_pipeline_hangs()]


def report(cases: list[Case]) -> list[tuple[str, bool]]:
    """Print one line per case (and its detail); return the targets."""
    print("")
    print("Real data")
    for c in cases:
        print(f"  {'ok   ' if c.ok else 'WRONG'} {c.name} ({c.ms:.0f} ms): {c.found}")
        print(f"        truth: {c.truth}; {c.detail}")
    if not any(PIPELINE_DIR.glob("*/case.json")):
        print(f"  (no {PIPELINE_DIR.relative_to(ROOT)}/*/case.json: pipeline hangs not evaluated)")
    return [(f"{c.name}: {c.found} (truth: {c.truth})", c.ok) for c in cases]

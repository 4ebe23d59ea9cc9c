"""Detection evaluation: every detector against simulated faults with ground truth, and real data.

From the repository root::

    .venv/bin/python bench/detection_eval.py --quick          # under a minute
    .venv/bin/python bench/detection_eval.py                  # the full evaluation (minutes)
    .venv/bin/python bench/detection_eval.py --trials 50 --ranks 64 --seed 3

What it does:

1. **Simulated faults** (``bench/simulate.py``): for each fault kind, ``--trials`` seeded jobs
   of 16–256 ranks (or ``--ranks``), 0.3–4 s compute per step, 1–3% jitter, with the fault
   injected at a random step and realistic magnitude: persistent and transient (30-step)
   stragglers 1.2–2×, hangs (1–2 idle culprits, or a tp all-reduce that never finishes),
   crashes (1–2 ranks), NaN (one rank's forward pass, or a mixed-precision overflow on every
   rank), loss spikes of 20–200%, slow links 1.6–4×, job slowdowns of 25–100% through compute,
   communication or data loading, and a memory leak (an extra: no target names it).
   **Group stragglers** (issue 15): a quarter to 45% of the ranks 1.1–1.3× slower from one
   step to the end of a 500-step run (at least 250 steps after the onset, so the 200-step
   window slides past it), in jobs of 16 ranks and ``--big-trials`` of ``--big-ranks``
   (1,024); one fault per rank, so recall counts ranks.
2. **Clean runs**: ``--clean-runs`` jobs of ``--clean-steps`` steps with no fault, for false
   alarms per 10,000 job steps; and ``--hetero-runs`` (plus ``--big-trials`` at
   ``--big-ranks``) **always-heterogeneous** clean runs: a quarter to 45% of the ranks 3–15%
   slower from the first step (up to the straggler detector's ``max_baseline_ratio``, past
   which a rank counts as slow from the start by design), which must raise nothing.
3. **As the backend runs the detectors.** Window detectors (straggler, numerics, slowdown,
   comm, memory) see the job's last 200 steps every ``--detect-interval`` seconds of simulated
   time (the embedded scheduler's 2 s; a tick with no new step is skipped), and the hang/crash
   detector sweeps every ``--sweep-interval`` seconds with each rank's state at that moment
   (``bench.simulate.rank_states``) and the backend's recent step durations. As
   ``backend.detection.runner`` does, each window is cut to its settled steps
   (``detectors.settle``; in a simulated run every rank reports every step, so nothing is
   held back) and the straggler detector gets each rank's baseline, learned once and carried
   (``bench.replay.Baselines``), and the step each rank's open straggler incident names it
   from (``IncidentTracker.named_since``); the slowdown detector also gets the job's step
   time before the window where 200 steps last under 3 minutes (:func:`slowdown_history`,
   as ``backend.detection.history`` loads it). Findings become incidents as
   ``backend/incidents/service.py`` makes them (one per key while it stays open; an episode
   that is already over is recorded once): each incident opened is one **alert**.
4. **Scoring** (:func:`score`). An alert is a true positive when it is of the fault's finding
   kind, names exactly the fault's ranks when it opens (for a hang the culprit set; for a
   slowdown, the right component instead) and opens after the onset (for a fault that ended,
   reporting an episode that starts before its end). The first such alert detects the fault;
   further incidents for the same fault (the back end re-recording an episode that is over)
   are *duplicates*, reported apart and left out of precision. Alerts that are true
   consequences of an injected fault (a job slowdown while a straggler or a slow link holds
   everyone up; the whole comm family slower during a communication slowdown) are counted
   apart too. Every other alert is a false positive. precision = TP / (TP + FP) over alerts of
   the fault's finding kind in all trials; recall = faults detected / faults injected; the
   onset error is the detected alert's ``first_step`` minus the true onset. Latency: from the
   onset to the tick at which the alert opened, in steps and simulated seconds; for stragglers
   also the step at which the detector's persistence rule fired (its own latency, without the
   tick). For hangs and crashes the *detector* latency is the earliest ``now`` at which
   ``hang.detect`` fires (bisection to 1 ms), measured from the last finished step; the sweep
   adds up to one sweep interval.
5. **Arrival orders** (``bench/eval_arrival.py``): a simulated group straggler (16 ranks, and
   ``--big-ranks`` when ``--big-trials``) and PAI job_1 delivered batch by batch in adversarial
   orders (whole-rank bursts, the slow ranks first, round-robin lags, random delays) to an
   in-process stand-in for the server; the findings must equal the in-order replay's.
6. **Real data** (``bench/eval_real.py``): PAI job_1 replayed with carried baselines (worker 6
   named from iteration 1811, workers 0–2 not), the Flight Recorder dumps of ``lock_gil_1st``
   (culprits {9, 14}), the Kineto traces of a 4-rank gloo job (rank 2 from iteration 6), and
   the pipeline-parallel hangs of ``tests/data/pipeline_hangs`` when that folder has its
   ``truth.json``.

Targets (from the issues): precision ≥ 0.95 and recall ≥ 0.95 on every fault kind; stragglers
flagged ≤ 10 steps after onset; hangs flagged ≤ max(5 × median step, 10 s) after the last
progress; zero false alarms on clean runs. Issue 15: group stragglers flagged ≤ 10 steps after
onset, dated within ±10 steps, still named at the end of the run, no incident re-opened; zero
alarms on always-heterogeneous runs; every arrival order equal to the in-order replay, whose
findings are the truth; every real case exact. Each is printed with PASS or FAIL. The exit
status is 0 unless ``--strict`` is given and a target fails.

Faults start at step 200 or later (a running job, a full window of history) and trials are
streamed from 30 steps before the onset; clean runs from their first step. To evaluate another
checkout's detectors, put it first: ``PYTHONPATH=/path/to/checkout .venv/bin/python
bench/detection_eval.py`` (the script appends this repository to ``sys.path``, after it).

Not modelled: shipping delay from the collector to the backend (add the collector's flush
interval to every latency), and database time.
"""

from __future__ import annotations

import argparse
import math
import pickle
import platform
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    # Appended, so that a PYTHONPATH entry (another checkout's detectors) still comes first.
    sys.path.append(str(Path(__file__).resolve().parents[1]))

import numpy as np

from bench import eval_arrival, eval_real
from bench.replay import (
    DETECTOR_OF_KIND,
    WINDOW,
    Alert,
    Baselines,
    IncidentTracker,
    backend_window,
    straggler_findings,
)
from bench.simulate import (
    Fault,
    JobConfig,
    Run,
    rank_states,
    recent_step_durations,
    simulate,
)
from detectors import comm, hang, memory, numerics, registry, slowdown
from detectors.finding import Finding
from detectors.window import StepHistory, StepWindow

__all__ = ["Alert", "IncidentTracker", "Trial", "load_trials", "main", "matches", "score"]

ONSET_TOLERANCE = 10  # steps a finding may date the onset before the injected one
WATCH_BEFORE = 30  # a fault trial is streamed from this many steps before the onset
TAIL = 150  # onsets fall at least this many steps before the end of a fault trial
RANK_CHOICES = (16, 32, 64, 128, 256)
# Group stragglers and heterogeneous clean runs (issue 15) run at 16 ranks, and ``--big-trials``
# more of each at ``--big-ranks`` (1,024). A group's onset leaves GROUP_TAIL steps to the end,
# so the 200-step window slides past it: the slowdown must still be named then.
SMALL_RANKS = 16
GROUP_STEPS = 500
GROUP_TAIL = 250
HETERO_STEPS = 1500
MISS_ALERTS_SHOWN = 6  # alerts of the trial listed with a missed fault
HANG_SEARCH_S = 1800.0  # give up looking for a hang/crash finding after this long
WINDOW_DETECTORS = ("straggler", "numerics", "slowdown", "comm", "memory")
# What a detection run and a sweep cover, as the backend derives it from the registry.
WINDOW_KINDS = registry.kinds_needing({"steps", "collectives"})
SWEEP_KINDS = registry.kinds_needing({"liveness"})

# Scenario name -> (fault kind, label). Scenarios are what recall is reported on.
SCENARIOS: dict[str, str] = {
    "straggler_persistent": "straggler",
    "straggler_transient": "straggler",
    "straggler_group": "straggler",
    "hang": "hang",
    "crash": "crash",
    "nan": "nan",
    "loss_spike": "loss_spike",
    "slow_link": "slow_link",
    "slowdown": "slowdown",
    "memory_leak": "memory_leak",
}
EXTRA_SCENARIOS = frozenset({"memory_leak"})  # evaluated, but no target in the issue names it
# Edge cases outside the fault list, scored on their own (not in any target):
# a crash after which the launcher tears the survivors down, and clean runs with synchronous
# checkpoints (the job pauses between two steps).
EDGE_SCENARIOS: dict[str, str] = {"crash_teardown": "crash"}
# Clean runs whose ranks are heterogeneous from the first step (a quarter to nearly half of
# them 3–15% slower, up to the straggler detector's ``max_baseline_ratio``): scored on their
# own, with their own target (no alarm).
CLEAN_KINDS = ("clean", "clean_checkpoints", "clean_heterogeneous")
ALL_SCENARIOS = (*SCENARIOS, *EDGE_SCENARIOS, *CLEAN_KINDS)
# Each scenario's seed stream; new scenarios go at the end, so the others' runs stay the same.
SEED_TAGS = (
    "straggler_persistent",
    "straggler_transient",
    "hang",
    "crash",
    "nan",
    "loss_spike",
    "slow_link",
    "slowdown",
    "memory_leak",
    "crash_teardown",
    "clean",
    "clean_checkpoints",
    "straggler_group",
    "clean_heterogeneous",
)
STRAGGLER_SCENARIOS = ("straggler_persistent", "straggler_transient", "straggler_group")
SCALE_SCENARIOS = frozenset({"straggler_group", "clean_heterogeneous"})


# --------------------------------------------------------------------------------------------
# Running the detectors over a simulated run


def window_findings(run: Run, lo: int, hi: int, *, window: StepWindow) -> list[Finding]:
    """Every window detector on step indices ``lo:hi`` of ``run``: the straggler detector
    through its registration on the backend's ``window`` of those steps (with the carried
    baselines and named ranks, ``bench.replay.backend_window``), the others as their
    registrations call them (``detectors.registry``); the simulator hands the comm detector
    its families and the memory detector the devices' capacity directly."""
    sl = slice(lo, hi)
    steps = run.steps[sl]
    out: list[Finding] = straggler_findings(window)
    out += numerics.detect_numerics(run.loss[:, sl], run.grad_norm[:, sl], steps=steps)
    out += slowdown.detect_slowdown(
        run.step_time[:, sl],
        run.comm_time[:, sl],
        run.data_time[:, sl],
        steps=steps,
        history=slowdown_history(run, lo, window),
    )
    out += comm.detect_comm(run.families(lo, hi), steps=steps)
    out += memory.detect_memory(run.mem_bytes[:, sl], run.capacity_bytes(), steps=steps)
    return out


def slowdown_history(run: Run, lo: int, window: StepWindow) -> StepHistory | None:
    """The steps before index ``lo`` that the backend gives the slowdown detector with this
    window (``backend.detection.history``), None when it gives none."""
    first = max(0, lo - slowdown.history_steps(window))
    if first == lo:
        return None
    return StepHistory.from_arrays(
        steps=run.steps[first:lo],
        step_time=run.step_time[:, first:lo],
        comm_time=run.comm_time[:, first:lo],
        data_time=run.data_time[:, first:lo],
    )


def stream_windows(
    run: Run, *, interval_s: float, phase: float, start: int = 0, width: int = WINDOW
) -> list[Alert]:
    """Window detectors every ``interval_s`` of simulated time over the run's finished steps,
    from the first tick at which at least ``start`` steps have finished (earlier ticks
    are skipped to save time: a fault trial is watched from a little before its onset, with
    the full window of history behind it). As the backend: the window is cut to its settled
    steps (every rank reports every step here, so nothing is held back) and the straggler
    detector gets each rank's baseline, learned at the first tick that allows it and kept
    (the simulated hardware does not change, so that equals learning at the job's start),
    and the ranks its open straggler incidents name, with their first steps."""
    tracker = IncidentTracker(WINDOW_KINDS)
    if run.n_steps == 0:
        return []
    keeper = Baselines(run.n_ranks)
    ranks = np.arange(run.n_ranks)
    done_before = 0
    now = run.config.t0 + phase
    end = run.last_progress + interval_s
    while now <= end:
        n_done = int(np.searchsorted(run.step_end, now, side="right"))
        if n_done > done_before and n_done >= max(start, 1):  # new steps: the job is dirty
            lo = max(0, n_done - width)
            window = backend_window(
                keeper,
                steps=run.steps[lo:n_done],
                ranks=ranks,
                step_time=run.step_time[:, lo:n_done],
                comm_time=run.comm_time[:, lo:n_done],
                live_ranks=run.n_ranks,
                incidents=tracker,
            )
            hi = lo + window.steps.size
            if hi > lo:
                findings = window_findings(run, lo, hi, window=window)
                tracker.apply(findings, step=int(run.steps[hi - 1]), now=now)
            done_before = n_done
        now += interval_s
    return tracker.results()


def _hang_detect(run: Run, now: float) -> list[Finding]:
    n_done = int(np.searchsorted(run.step_end, now, side="right"))
    if run.stall is not None:
        n_done = min(n_done, run.stall.index)
    durations = recent_step_durations(run, n_done)
    states = rank_states(run, now)  # ranks that said goodbye are left out, as the backend does
    if not states:
        return []
    return hang.detect(
        states, now=now, step_durations=durations, groups=run.groups(), finished=False
    )


def _first_firing(run: Run, lo: float, hi: float, *, resolution: float = 1e-3) -> float:
    """Earliest ``now`` in ``(lo, hi]`` at which the hang detector returns a finding, given
    that it returns none at ``lo`` and some at ``hi`` (bisection)."""
    while hi - lo > resolution:
        mid = 0.5 * (lo + hi)
        if _hang_detect(run, mid):
            hi = mid
        else:
            lo = mid
    return hi


def sweep_hangs(
    run: Run,
    *,
    interval_s: float,
    phase: float,
    start_time: float | None = None,
    after_s: float = 60.0,
) -> list[Alert]:
    """The hang/crash detector every ``interval_s`` from ``start_time`` (default: the job's
    start) until ``after_s`` after its last progress (for a hang or crash: until a finding
    and ``after_s`` more, at most ``HANG_SEARCH_S``). The first finding's exact firing time
    is bisected."""
    tracker = IncidentTracker(SWEEP_KINDS)
    t0 = run.config.t0
    stop = run.last_progress + after_s
    if run.stall is not None:
        stop = run.last_progress + HANG_SEARCH_S
    now = t0 + phase
    if start_time is not None and start_time > now:
        now += interval_s * math.floor((start_time - now) / interval_s)
    prev = now - interval_s
    fired = False
    while now <= stop:
        findings = _hang_detect(run, now)
        if findings and not fired:
            fired = True
            first = _first_firing(run, prev, now)
            if run.stall is not None:
                stop = min(stop, now + after_s)
            tracker.apply(
                findings,
                step=_last_step(run, now),
                now=now,
                fire_time=first,
            )
        else:
            tracker.apply(findings, step=_last_step(run, now), now=now)
        prev = now
        now += interval_s
    return tracker.results()


def _last_step(run: Run, now: float) -> int | None:
    n_done = int(np.searchsorted(run.step_end, now, side="right"))
    n_done = min(n_done, run.n_steps)
    return int(run.steps[n_done - 1]) if n_done else None


# --------------------------------------------------------------------------------------------
# Trials


@dataclass
class Trial:
    """One simulated job: its ground truth, its alerts, and what scoring needs to know."""

    scenario: str  # one of ALL_SCENARIOS
    seed: int
    ranks: int
    first_step: int  # training step id of step index 0
    median_step_s: float
    faults: tuple[Fault, ...]
    alerts: list[Alert]
    job_steps: int  # finished steps
    last_progress: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)


def make_job(rng: np.random.Generator, *, ranks: int, steps: int, seed: int) -> JobConfig:
    """A job of realistic variety: 0.3–4 s compute per step (log-uniform), 1–3% jitter."""
    return JobConfig(
        ranks=ranks,
        steps=steps,
        seed=seed,
        first_step=int(rng.integers(1_000, 200_000)),
        step_s=float(math.exp(rng.uniform(math.log(0.3), math.log(4.0)))),
        jitter=float(rng.uniform(0.01, 0.03)),
        common_jitter=float(rng.uniform(0.01, 0.03)),
    )


def make_faults(scenario: str, rng: np.random.Generator, cfg: JobConfig) -> list[Fault]:
    """The faults of a ``scenario`` trial: one, or for a group straggler one per rank of the
    group (a quarter to 45% of the ranks, chosen at random, 1.1–1.3× slower from the same
    step to the end of the run), so that it is scored rank by rank."""
    if scenario != "straggler_group":
        return [make_fault(scenario, rng, cfg)]
    onset = int(rng.integers(WINDOW, cfg.steps - GROUP_TAIL + 1))
    n = int(rng.integers(math.ceil(cfg.ranks / 4), int(0.45 * cfg.ranks) + 1))
    group = np.sort(rng.choice(cfg.ranks, n, replace=False))
    magnitude = float(rng.uniform(1.1, 1.3))
    return [Fault("straggler", (int(r),), onset, magnitude=magnitude) for r in group]


def make_fault(scenario: str, rng: np.random.Generator, cfg: JobConfig) -> Fault:
    """A fault of ``scenario`` with a random onset, culprits and a realistic magnitude."""
    r_n, s_n = cfg.ranks, cfg.steps
    onset = int(rng.integers(WINDOW, s_n - TAIL + 1))
    one = (int(rng.integers(r_n)),)
    if scenario == "straggler_persistent":
        return Fault("straggler", one, onset, magnitude=float(rng.uniform(1.2, 2.0)))
    if scenario == "straggler_transient":
        return Fault("straggler", one, onset, duration=30, magnitude=float(rng.uniform(1.2, 2.0)))
    if scenario == "hang":
        if rng.random() < 0.7:
            n = int(rng.integers(1, 3))
            culprits = tuple(sorted(int(r) for r in rng.choice(r_n, n, replace=False)))
            return Fault("hang", culprits, onset, variant="idle")
        g = int(rng.integers(cfg.n_tp_groups))
        return Fault(
            "hang", tuple(range(g * cfg.tp, (g + 1) * cfg.tp)), onset, variant="stuck_collective"
        )
    if scenario == "crash_teardown":  # torchrun kills the others 0.2–3 s later, no goodbye
        teardown = float(rng.uniform(0.2, 3.0))
        return Fault("crash", one, onset, variant="process", teardown_s=teardown)
    if scenario == "crash":
        if rng.random() < 0.6:
            return Fault("crash", one, onset, variant="process")
        g = int(rng.integers(cfg.n_tp_groups))  # a node: its tp group
        return Fault("crash", tuple(range(g * cfg.tp, (g + 1) * cfg.tp)), onset, variant="node")
    if scenario == "nan":
        if rng.random() < 0.7:
            return Fault("nan", one, onset, variant="rank")
        return Fault("nan", tuple(range(r_n)), onset, variant="overflow")
    if scenario == "loss_spike":
        mag = float(math.exp(rng.uniform(math.log(0.2), math.log(2.0))))
        return Fault("loss_spike", (), onset, duration=int(rng.integers(2, 31)), magnitude=mag)
    if scenario == "slow_link":
        return Fault("slow_link", one, onset, magnitude=float(rng.uniform(1.6, 4.0)))
    if scenario == "slowdown":
        component = str(rng.choice(["compute", "comm", "data"]))
        return Fault(
            "slowdown", (), onset, magnitude=float(rng.uniform(1.25, 2.0)), component=component
        )
    if scenario == "memory_leak":
        headroom = (cfg.capacity_gib - cfg.mem_gib - cfg.mem_spread_gib) * (1 << 30)
        to_full = float(rng.uniform(150, 450))  # steps from onset until the device is full
        return Fault("memory_leak", one, onset, magnitude=headroom / to_full)
    raise ValueError(f"unknown scenario {scenario!r}")


def run_trial(
    scenario: str,
    *,
    seed: int,
    index: int,
    ranks: int | None,
    steps: int,
    detect_interval: float,
    sweep_interval: float,
) -> Trial:
    """Simulate one job (with ``scenario``'s fault, or none for ``"clean"``) and collect the
    alerts of every detector, streamed as the backend would see them. Without ``ranks``,
    the job has 16–256 ranks (``RANK_CHOICES``, cycled)."""
    tag = SEED_TAGS.index(scenario)
    rng = np.random.default_rng([seed, tag, index])
    r_n = ranks or RANK_CHOICES[index % len(RANK_CHOICES)]
    cfg = make_job(rng, ranks=r_n, steps=steps, seed=int(rng.integers(2**31)))
    if scenario == "clean_checkpoints":  # a 20–120 s synchronous checkpoint every 400 steps
        cfg = replace(cfg, checkpoint_every=400, checkpoint_s=float(rng.uniform(20, 120)))
    if scenario == "clean_heterogeneous":  # a quarter to 45% of the ranks 3–15% slower
        frac = float(rng.uniform(0.25, 0.45))
        cfg = replace(cfg, hetero_frac=frac, hetero_min=0.03, hetero_max=0.15)
    faults = [] if scenario in CLEAN_KINDS else make_faults(scenario, rng, cfg)
    run = simulate(cfg, faults)
    # A fault trial is watched from WATCH_BEFORE steps before its onset (the windows then
    # hold a full history); a clean run from its first step.
    start = max(0, min(f.onset_step for f in faults) - WATCH_BEFORE) if faults else 0
    start_time = float(run.step_start[start]) if start < run.n_steps else run.last_progress
    alerts = stream_windows(
        run, interval_s=detect_interval, phase=float(rng.uniform(0, detect_interval)), start=start
    )
    alerts += sweep_hangs(
        run,
        interval_s=sweep_interval,
        phase=float(rng.uniform(0, sweep_interval)),
        start_time=start_time,
    )
    median_step = float(np.median(run.step_time[0])) if run.n_steps else float("nan")
    return Trial(
        scenario=scenario,
        seed=cfg.seed,
        ranks=r_n,
        first_step=cfg.first_step,
        median_step_s=median_step,
        faults=run.faults,
        alerts=alerts,
        job_steps=run.n_steps,
        last_progress=run.last_progress,
    )


# --------------------------------------------------------------------------------------------
# Scoring


def onset_id(trial: Trial, fault: Fault) -> int:
    return trial.first_step + fault.onset_step


def fault_end(fault: Fault) -> int | None:
    """Last step index at which the fault still shows (None: to the end of the run). A loss
    spike decays with time constant ``duration``: it shows until the bump is under 1%."""
    if fault.duration is None:
        return None
    if fault.kind == "loss_spike":
        return fault.onset_step + math.ceil(
            fault.duration * math.log(max(fault.magnitude, 0.01) / 0.01)
        )
    return fault.onset_step + fault.duration - 1


def matches(alert: Alert, fault: Fault, trial: Trial) -> bool:
    """Is ``alert`` a correct report of ``fault``? Right kind, right ranks (for a slowdown
    the right component), opened after the onset; for a fault that ended, the episode it
    reports starts before that end (``ONSET_TOLERANCE`` steps of slack)."""
    if alert.kind != fault.finding_kind:
        return False
    if fault.kind == "slowdown":
        if (alert.component or alert.key.partition(":")[2]) != fault.component:
            return False
    elif fault.kind == "loss_spike":
        if alert.ranks:
            return False
    elif set(alert.ranks) != set(fault.ranks):
        return False
    assert fault.onset_time is not None
    if alert.opened_time < fault.onset_time:
        return False
    if alert.kind in SWEEP_KINDS:
        return True
    end = fault_end(fault)
    return (
        end is None
        or alert.first_step is None
        or alert.first_step <= trial.first_step + end + ONSET_TOLERANCE
    )


def explained(alert: Alert, fault: Fault) -> bool:
    """A true consequence of ``fault`` that is not its report: not a false alarm."""
    assert fault.onset_time is not None
    if alert.opened_time < fault.onset_time:
        return False
    if alert.kind == "slowdown" and fault.kind in ("straggler", "slow_link"):
        return True  # everyone waits for the slow rank or link: the job did slow down
    if alert.kind == "comm_anomaly" and not alert.ranks:
        return fault.kind == "slowdown" and fault.component == "comm"  # the whole family slower
    return False


@dataclass
class KindScore:
    """Per scenario: faults injected and found, alerts, latencies."""

    injected: int = 0
    detected: int = 0
    tp: int = 0  # alerts that first report one of this scenario's faults (one per fault)
    duplicates: int = 0  # further incidents for a fault already reported (not in precision)
    onset_error_steps: list[float] = field(default_factory=list)  # first_step - onset
    latency_steps: list[float] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)
    detector_latency_steps: list[float] = field(default_factory=list)  # stragglers
    fire_latency_s: list[float] = field(default_factory=list)  # hang/crash, from last progress
    fire_latency_steps: list[float] = field(default_factory=list)  # the same / median step
    since_crash_s: list[float] = field(default_factory=list)  # crash, from the crash
    hang_targets_s: list[float] = field(default_factory=list)
    hang_over_target: int = 0
    misses: list[str] = field(default_factory=list)  # what the detector said instead


@dataclass
class Scores:
    by_scenario: dict[str, KindScore]
    fp_by_kind: dict[str, int]  # finding kind -> false-positive alerts (all trials)
    fp_examples: dict[str, list[str]]
    consequences: dict[str, int]  # finding kind -> explained alerts
    clean_steps: int
    clean_fp_by_detector: dict[str, int]
    clean_examples: list[str]

    def precision(self, scenario: str) -> float:
        kind = _finding_kind(scenario)
        tp = self.by_scenario[scenario].tp
        fp = self.fp_by_kind.get(kind, 0)
        return tp / (tp + fp) if tp + fp else float("nan")

    def recall(self, scenario: str) -> float:
        s = self.by_scenario[scenario]
        return s.detected / s.injected if s.injected else float("nan")


def _finding_kind(scenario: str) -> str:
    return Fault({**SCENARIOS, **EDGE_SCENARIOS}[scenario]).finding_kind


def score(trials: Sequence[Trial]) -> Scores:
    """Match every alert of every trial to the injected faults; see :func:`matches`."""
    by: dict[str, KindScore] = {s: KindScore() for s in (*SCENARIOS, *EDGE_SCENARIOS)}
    fp: dict[str, int] = defaultdict(int)
    fp_examples: dict[str, list[str]] = defaultdict(list)
    conseq: dict[str, int] = defaultdict(int)
    clean_steps = 0
    clean_fp: dict[str, int] = defaultdict(int)
    clean_examples: list[str] = []
    for t in trials:
        if t.scenario in CLEAN_KINDS:
            clean_steps += t.job_steps
        first_match: dict[int, Alert] = {}
        for a in t.alerts:
            hit = [i for i, f in enumerate(t.faults) if matches(a, f, t)]
            if hit:
                i = hit[0]
                if i in first_match:
                    by[t.scenario].duplicates += 1
                else:
                    by[t.scenario].tp += 1
                    first_match[i] = a
                continue
            if any(explained(a, f) for f in t.faults):
                conseq[a.kind] += 1
                continue
            fp[a.kind] += 1
            desc = (
                f"{t.scenario} seed {t.seed} R={t.ranks}: {a.key} ranks {_short(a.ranks)} "
                f"first_step {a.first_step} opened at step {a.opened_step}"
            )
            if t.faults:
                f0 = t.faults[0]
                desc += f" (fault {f0.kind} {_short(f0.ranks)} at step {onset_id(t, f0)})"
            fp_examples[a.kind].append(desc)
            if t.scenario in CLEAN_KINDS:
                clean_fp[a.detector] += 1
                clean_examples.append(desc)
        if t.scenario in CLEAN_KINDS:
            continue
        ks = by[t.scenario]
        for i, f in enumerate(t.faults):
            ks.injected += 1
            hit_alert = first_match.get(i)
            if hit_alert is None:
                said = [
                    f"{x.key} {_short(x.ranks)}"
                    + (
                        f" (later {_short(x.ranks_later)})"
                        if x.ranks_later is not None and x.ranks_later != x.ranks
                        else ""
                    )
                    for x in t.alerts[:MISS_ALERTS_SHOWN]
                ] or ["nothing"]
                if len(t.alerts) > MISS_ALERTS_SHOWN:
                    said.append(f"… {len(t.alerts) - MISS_ALERTS_SHOWN} more")
                ks.misses.append(
                    f"seed {t.seed} R={t.ranks} {f.kind}{'/' + f.variant if f.variant else ''}"
                    f"{'/' + f.component if f.component else ''} ranks {_short(f.ranks)} "
                    f"x{f.magnitude:.2f} at step {onset_id(t, f)}: got {', '.join(said)}"
                )
                continue
            ks.detected += 1
            a = hit_alert
            assert f.onset_time is not None
            if a.kind in SWEEP_KINDS:
                target = max(5.0 * t.median_step_s, 10.0)
                ks.hang_targets_s.append(target)
                fired = a.fire_time if a.fire_time is not None else a.opened_time
                ks.fire_latency_s.append(fired - t.last_progress)
                ks.fire_latency_steps.append((fired - t.last_progress) / t.median_step_s)
                ks.latency_s.append(a.opened_time - t.last_progress)
                if f.kind == "crash":
                    ks.since_crash_s.append(fired - f.onset_time)
                if fired - t.last_progress > target + 1e-3:
                    ks.hang_over_target += 1
                continue
            if a.opened_step is not None:
                ks.latency_steps.append(a.opened_step - onset_id(t, f))
            if a.first_step is not None and a.kind != "memory_pressure":
                ks.onset_error_steps.append(a.first_step - onset_id(t, f))
            ks.latency_s.append(a.opened_time - f.onset_time)
            if a.detected_step is not None:
                ks.detector_latency_steps.append(a.detected_step - onset_id(t, f))
    return Scores(
        by_scenario=by,
        fp_by_kind=dict(fp),
        fp_examples=dict(fp_examples),
        consequences=dict(conseq),
        clean_steps=clean_steps,
        clean_fp_by_detector=dict(clean_fp),
        clean_examples=clean_examples,
    )


def _short(ranks: Sequence[int], limit: int = 8) -> str:
    if len(ranks) <= limit:
        return "(" + ",".join(map(str, ranks)) + ")"
    return f"({len(ranks)} ranks)"


# --------------------------------------------------------------------------------------------
# Report


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _lat(values: Sequence[float], fmt: str = "{:.0f}") -> str:
    if not values:
        return "-"
    return "/".join(fmt.format(_pct(values, q)) for q in (50, 95, 100))


def _num(x: float, fmt: str = "{:.3f}") -> str:
    return "-" if x != x else fmt.format(x)


def report(
    scores: Scores,
    *,
    args: argparse.Namespace,
    trials: Sequence[Trial],
    elapsed_s: float,
) -> list[tuple[str, bool]]:
    """Print the tables; return (target, passed) pairs."""
    out = print
    n_clean = sum(1 for t in trials if t.scenario == "clean")
    out(
        f"Vigil detection evaluation — seed {args.seed}, {args.trials} trials per fault kind "
        f"({args.steps} steps each), {n_clean} clean runs × {args.clean_steps} steps"
    )
    ranks = f"{args.ranks}" if args.ranks else ("16, 32" if args.quick else "16–256") + " (cycled)"
    big = f" and {args.big_trials} more at {args.big_ranks:,}" if args.big_trials else ""
    ranks += f"; group stragglers and heterogeneous runs at {args.ranks or SMALL_RANKS}{big}"
    out(
        f"ranks {ranks}; windows of {WINDOW} steps every {args.detect_interval:g} s of "
        f"simulated time; hang sweep every {args.sweep_interval:g} s; "
        f"{elapsed_s:.0f} s on {platform.python_implementation()} {platform.python_version()}"
    )
    out("")
    header = (
        f"{'fault kind':<22}{'detector':<10}{'n':>4}{'found':>6}{'recall':>8}{'TP':>5}"
        f"{'FP':>5}{'prec.':>7}  {'latency steps p50/p95/max':<27}{'latency s p50/p95/max':<24}"
    )
    out(header)
    out("-" * len(header))
    results: list[tuple[str, bool]] = []
    for scen in SCENARIOS:
        ks = scores.by_scenario[scen]
        if not ks.injected:
            continue
        kind = _finding_kind(scen)
        det = DETECTOR_OF_KIND[kind]
        p, r = scores.precision(scen), scores.recall(scen)
        if kind in SWEEP_KINDS:
            steps = _lat(ks.fire_latency_steps, "{:.1f}")
            secs = _lat(ks.fire_latency_s, "{:.1f}")
        else:
            steps = _lat(ks.latency_steps)
            secs = _lat(ks.latency_s, "{:.1f}")
        label = scen + (" *" if scen in EXTRA_SCENARIOS else "")
        out(
            f"{label:<22}{det:<10}{ks.injected:>4}{ks.detected:>6}{_num(r):>8}{ks.tp:>5}"
            f"{scores.fp_by_kind.get(kind, 0):>5}{_num(p):>7}  {steps:<27}{secs:<24}"
        )
        if scen not in EXTRA_SCENARIOS:
            results.append((f"precision ≥ 0.95: {scen} ({_num(p)})", p == p and p >= 0.95))
            results.append((f"recall ≥ 0.95: {scen} ({_num(r)})", r == r and r >= 0.95))
    out("")
    out(
        "* memory_leak: an extra (no target names it). FP are per finding kind over all trials "
        "(clean runs included); persistent and transient stragglers share the straggler "
        "kind's FP. Hang/crash latency: from the last finished step to the earliest moment "
        "hang.detect fires (steps = that / the job's median step)."
    )

    out("")
    out("Onset dating — detected alert's first_step minus the true onset, steps (p5/p50/p95):")
    parts = []
    for scen in SCENARIOS:
        errs = scores.by_scenario[scen].onset_error_steps
        if errs:
            lo, mid, hi = (_pct(errs, q) for q in (5, 50, 95))
            parts.append(f"{scen} {lo:+.0f}/{mid:+.0f}/{hi:+.0f}")
    out("  " + "; ".join(parts))

    # Stragglers: streamed and detector latency.
    out("")
    out("Stragglers — latency after onset, steps (p50/p95/max):")
    worst = 0.0
    for scen in STRAGGLER_SCENARIOS:
        ks = scores.by_scenario[scen]
        if not ks.injected:
            continue
        if scen != "straggler_group":  # the group has its own target (report_group)
            worst = max([worst, *ks.latency_steps])
        out(
            f"  {scen:<22} as streamed (tick at {args.detect_interval:g} s): "
            f"{_lat(ks.latency_steps):<12} detector's own (persistence fired): "
            f"{_lat(ks.detector_latency_steps)}"
        )
    have_str = any(
        scores.by_scenario[s].latency_steps for s in ("straggler_persistent", "straggler_transient")
    )
    if have_str:
        results.append(
            (f"stragglers flagged ≤ 10 steps after onset (max {worst:.0f})", worst <= 10)
        )

    # Hangs (and crashes): latency against the target.
    out("")
    out("Hangs and crashes — seconds from the last finished step (p50/p95/max):")
    for scen in ("hang", "crash"):
        ks = scores.by_scenario[scen]
        if not ks.injected:
            continue
        over = ks.hang_over_target
        extra = (
            f"; from the crash itself {_lat(ks.since_crash_s, '{:.1f}')}"
            if ks.since_crash_s
            else ""
        )
        out(
            f"  {scen:<6} detector fires {_lat(ks.fire_latency_s, '{:.2f}'):<20} "
            f"first sweep sees it {_lat(ks.latency_s, '{:.2f}'):<20} "
            f"target max(5×median step, 10 s) {_lat(ks.hang_targets_s, '{:.1f}')}; "
            f"over target: {over} of {ks.detected}{extra}"
        )
        if scen == "hang":
            results.append(
                (
                    f"hangs flagged ≤ max(5 × median step, 10 s) after last progress "
                    f"({ks.detected - over} of {ks.detected} within)",
                    ks.detected > 0 and over == 0,
                )
            )
    over_hang = [t for t in trials if t.scenario == "hang"]
    _print_hang_detail(scores, over_hang)

    # Clean runs.
    out("")
    n_steps = scores.clean_steps
    out(f"Clean runs — {n_steps:,} job steps; false alarms per 10,000 clean steps:")
    for det in (*WINDOW_DETECTORS, "hang"):
        n = scores.clean_fp_by_detector.get(det, 0)
        rate = 1e4 * n / n_steps if n_steps else float("nan")
        bound = 1e4 * 3.0 / n_steps if n_steps else float("nan")  # 95% upper bound, 0 events
        note = f"(95% upper bound {bound:.2f})" if n == 0 else ""
        out(f"  {det:<10} {n:>4} alarms  {rate:6.2f} per 10k steps {note}")
    total_clean = sum(scores.clean_fp_by_detector.values())
    if n_steps:
        results.append(
            (
                f"zero false alarms on clean runs ({total_clean} over {n_steps:,} steps)",
                total_clean == 0,
            )
        )
    for ex in scores.clean_examples[:10]:
        out(f"    {ex}")

    if scores.consequences:
        out("")
        out(
            "Consequence alerts (true, caused by an injected fault, neither TP nor FP): "
            + ", ".join(f"{k} {v}" for k, v in sorted(scores.consequences.items()))
        )
    dups = {s: k.duplicates for s, k in scores.by_scenario.items() if k.duplicates}
    if dups:
        out(
            "Duplicate incidents for a fault already reported (not in precision): "
            + ", ".join(f"{k} {v}" for k, v in dups.items())
        )

    # Misses and false positives, for the record.
    misses = [(s, m) for s, k in scores.by_scenario.items() for m in k.misses]
    if misses:
        out("")
        out(f"Missed faults ({len(misses)}; first 5 per kind):")
        shown: dict[str, int] = defaultdict(int)
        for s, m in misses:
            if shown[s] < 5:
                out(f"  [{s}] {m}")
            shown[s] += 1
    fps = [(k, e) for k, v in scores.fp_examples.items() for e in v]
    if fps:
        out("")
        out(f"False-positive alerts ({len(fps)}; first 5 per kind):")
        for kind, examples in scores.fp_examples.items():
            for e in examples[:5]:
                out(f"  [{kind}] {e}")

    return results


def _print_hang_detail(scores: Scores, trials: Sequence[Trial]) -> None:
    """For hangs over the target: the job's median step and what the timeout was."""
    over = []
    for t in trials:
        for f in t.faults:
            a = next((a for a in t.alerts if matches(a, f, t)), None)
            if a is None or a.fire_time is None:
                continue
            target = max(5 * t.median_step_s, 10.0)
            lat = a.fire_time - t.last_progress
            if lat > target + 1e-3:
                over.append((t, lat, target))
    if over:
        print(f"  hangs over the target ({len(over)}): median step → latency vs target")
        for t, lat, target in over[:8]:
            print(
                f"    R={t.ranks:<4} median step {t.median_step_s:.2f} s → "
                f"{lat:.1f} s vs {target:.1f} s"
            )


# --------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0, help="base seed (default 0)")
    p.add_argument("--trials", type=int, default=None, help="trials per fault kind (40; quick 3)")
    p.add_argument("--ranks", type=int, default=None, help="ranks per job (default: 16–256)")
    p.add_argument("--steps", type=int, default=None, help="steps per fault trial (450; quick 360)")
    p.add_argument("--clean-runs", type=int, default=None, help="clean jobs (20; quick 1)")
    p.add_argument(
        "--clean-steps", type=int, default=None, help="steps per clean job (5000; quick 1500)"
    )
    p.add_argument("--detect-interval", type=float, default=2.0, help="seconds between window runs")
    p.add_argument("--sweep-interval", type=float, default=2.0, help="seconds between hang sweeps")
    p.add_argument("--only", nargs="*", choices=ALL_SCENARIOS, help="run only these scenarios")
    p.add_argument(
        "--edge-trials",
        type=int,
        default=None,
        help="trials of the informational edge cases (10; quick 0 = skip)",
    )
    p.add_argument(
        "--big-trials",
        type=int,
        default=None,
        help="group-straggler and heterogeneous runs at --big-ranks, and the arrival-order "
        "case at that size (4; quick 0 = 16 ranks only)",
    )
    p.add_argument("--big-ranks", type=int, default=1024, help="ranks of those runs (1024)")
    p.add_argument(
        "--hetero-runs", type=int, default=None, help="heterogeneous clean runs (6; quick 1)"
    )
    p.add_argument("--quick", action="store_true", help="a smaller run, under a minute")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target fails")
    p.add_argument(
        "--save", metavar="PATH", help="pickle every trial here (read back with load_trials)"
    )
    args = p.parse_args(argv)
    q = args.quick
    args.trials = args.trials or (3 if q else 40)
    args.steps = args.steps or (360 if q else 450)
    args.clean_runs = args.clean_runs if args.clean_runs is not None else (1 if q else 20)
    args.clean_steps = args.clean_steps or (1500 if q else 5000)
    if args.edge_trials is None:
        args.edge_trials = 0 if q else 10
    if args.big_trials is None:
        args.big_trials = 0 if q else 4
    if args.hetero_runs is None:
        args.hetero_runs = 1 if q else 6
    if args.big_ranks < 16 or args.big_ranks % 8:
        p.error("--big-ranks must be a multiple of 8, at least 16")
    if args.ranks is not None and (args.ranks < 16 or args.ranks % 8):
        p.error("--ranks must be a multiple of 8, at least 16")
    if args.steps < WINDOW + TAIL:
        p.error(
            f"--steps must be at least {WINDOW + TAIL} (onsets fall in {WINDOW} .. steps-{TAIL})"
        )
    return args


def load_trials(path: str | Path) -> list[Trial]:
    """Trials written by ``--save`` (the classes of a run as a script live in ``__main__``).

    Only open files you wrote yourself: this is pickle.
    """

    class _Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if module == "__main__":
                module = "bench.detection_eval"
            return super().find_class(module, name)

    with open(path, "rb") as fh:
        trials: list[Trial] = _Unpickler(fh).load()
    return trials


def _runs_for(scen: str, args: argparse.Namespace) -> tuple[int, int]:
    """(trials, steps per trial) of a scenario."""
    if scen == "clean":
        return args.clean_runs, args.clean_steps
    if scen == "clean_checkpoints":
        return args.edge_trials // 5 or 1, 2000
    if scen in EDGE_SCENARIOS:
        return args.edge_trials, args.steps
    return args.trials, args.steps


def plan(scen: str, args: argparse.Namespace) -> list[tuple[int, int | None, int]]:
    """(index, ranks, steps) of every trial of a scenario: group stragglers and heterogeneous
    clean runs at 16 ranks (or ``--ranks``), then ``--big-trials`` at ``--big-ranks``; the
    others at ``--ranks`` (default: 16–256, cycled; quick: 16 and 32)."""
    if scen in SCALE_SCENARIOS:
        n, steps = (
            (args.trials, GROUP_STEPS)
            if scen == "straggler_group"
            else (args.hetero_runs, HETERO_STEPS)
        )
        small = [(i, args.ranks or SMALL_RANKS, steps) for i in range(n)]
        return small + [(n + j, args.big_ranks, steps) for j in range(args.big_trials)]
    ranks_list: Sequence[int | None] = (args.ranks,)
    if args.quick and args.ranks is None:
        ranks_list = (16, 32)
    n, steps = _runs_for(scen, args)
    return [(i, ranks_list[i % len(ranks_list)], steps) for i in range(n)]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    chosen = args.only or [
        *SCENARIOS,
        "clean",
        "clean_heterogeneous",
        *((*EDGE_SCENARIOS, "clean_checkpoints") if args.edge_trials else ()),
    ]
    trials: list[Trial] = []
    for scen in chosen:
        t_scen = time.perf_counter()
        runs = plan(scen, args)
        for index, ranks, steps in runs:
            trials.append(
                run_trial(
                    scen,
                    seed=args.seed,
                    index=index,
                    ranks=ranks,
                    steps=steps,
                    detect_interval=args.detect_interval,
                    sweep_interval=args.sweep_interval,
                )
            )
        elapsed = time.perf_counter() - t_scen
        print(f"  {scen:<22} {len(runs):>3} runs  {elapsed:6.1f} s", file=sys.stderr)
    if args.save:
        with open(args.save, "wb") as fh:
            pickle.dump(trials, fh)
    apart = {"crash_teardown", "clean_checkpoints", "clean_heterogeneous"}
    main_trials = [t for t in trials if t.scenario not in apart]
    results = report(
        score(main_trials), args=args, trials=main_trials, elapsed_s=time.perf_counter() - start
    )
    results += report_group([t for t in main_trials if t.scenario == "straggler_group"])
    results += report_heterogeneous([t for t in trials if t.scenario == "clean_heterogeneous"])
    t_more = time.perf_counter()
    big = args.big_ranks if args.big_trials else None
    results += eval_arrival.report(eval_arrival.eval_arrival(big_ranks=big, seed=args.seed))
    results += eval_real.report(eval_real.eval_all())
    print(
        f"  arrival orders and real cases  {time.perf_counter() - t_more:6.1f} s", file=sys.stderr
    )
    edge_trials = [t for t in trials if t.scenario in {"crash_teardown", "clean_checkpoints"}]
    if edge_trials:
        report_edges(edge_trials)
    print("")
    print("Targets")
    for name, ok in results:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    failed = [name for name, ok in results if not ok]
    return 1 if (args.strict and failed) else 0


MAGNITUDE_BANDS = ((1.10, 1.15), (1.15, 1.20), (1.20, 1.30))


def report_group(trials: Sequence[Trial]) -> list[tuple[str, bool]]:
    """Group stragglers in detail, per job size and per slowdown: ranks named, ranks still
    named at the end of the run (the 200-step window has slid past the onset by then: a
    baseline learned anew from each window would have absorbed the slowdown), incidents
    re-opened (a rank's incident resolved, then opened again: a notification each time)."""
    if not trials:
        return []
    print("")
    print("Group stragglers — a quarter to 45% of the ranks 1.1–1.3× slower from one step on:")
    # per row: ranks slowed, named, still named at the end, incidents re-opened, jobs, exact
    rows: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(6, dtype=np.int64))
    lat: list[float] = []
    onset_err: list[float] = []
    exact = 0
    for t in trials:
        sc = score([t])
        s = sc.by_scenario["straggler_group"]
        whole = s.detected == s.injected and not sc.fp_by_kind.get("straggler")
        exact += whole
        lat += s.latency_steps
        onset_err += s.onset_error_steps
        named_at_end = {
            a.ranks for a in t.alerts if a.kind == "straggler" and a.closed_time is None
        }
        at_end = sum(f.ranks in named_at_end for f in t.faults)
        mag = t.faults[0].magnitude
        band = next(f"{lo:.2f}–{hi:.2f}×" for lo, hi in MAGNITUDE_BANDS if mag <= hi)
        for key in (f"{t.ranks:,} ranks", band):
            rows[key] += (s.injected, s.detected, at_end, s.duplicates, 1, whole)
    print(
        f"  {'':<12}{'jobs':>5}{'exact':>6}{'ranks':>7}{'named':>7}{'recall':>8}"
        f"{'at end':>8}{'share':>7}{'re-opened':>11}"
    )
    for key, (n, found, end, again, jobs, ok) in rows.items():
        print(
            f"  {key:<12}{jobs:>5}{ok:>6}{n:>7}{found:>7}{found / n:>8.3f}{end:>8}"
            f"{end / n:>7.3f}{again:>11}"
        )
    total = np.sum([v for k, v in rows.items() if k.endswith(" ranks")], axis=0)
    n_all, end_all, again_all = int(total[0]), int(total[2]), int(total[3])
    worst = max(lat, default=float("nan"))
    err = (min(onset_err, default=0.0), max(onset_err, default=0.0))
    print(
        f"  exact: every rank of the group named and no other straggler ({exact} of "
        f"{len(trials)} jobs); at end: ranks still named at the end of the run; latency "
        f"p50/p95/max {_lat(lat)} steps; onset dated {err[0]:+.0f}..{err[1]:+.0f} steps"
    )
    return [
        (f"group stragglers flagged ≤ 10 steps after onset (max {worst:.0f})", worst <= 10),
        (
            f"group stragglers: onset dated within ±{ONSET_TOLERANCE} steps "
            f"({err[0]:+.0f}..{err[1]:+.0f})",
            bool(onset_err) and max(map(abs, err)) <= ONSET_TOLERANCE,
        ),
        (
            f"group stragglers still named at the end of the run ({end_all} of {n_all})",
            n_all > 0 and end_all == n_all,
        ),
        (f"group stragglers: no incident re-opened ({again_all})", again_all == 0),
    ]


def report_heterogeneous(trials: Sequence[Trial]) -> list[tuple[str, bool]]:
    """Clean runs whose ranks are heterogeneous from the first step: no alarm wanted."""
    if not trials:
        return []
    s = score(trials)
    alarms = sum(s.clean_fp_by_detector.values())
    sizes = ", ".join(sorted({f"{t.ranks:,}" for t in trials}, key=len))
    print("")
    print(
        f"Always-heterogeneous clean runs — {len(trials)} jobs of {sizes} ranks, a quarter to "
        f"45% of the ranks 3–15% slower from the first step; {s.clean_steps:,} job steps: "
        f"{alarms} alarms"
        + (
            f" ({', '.join(f'{k} {v}' for k, v in s.clean_fp_by_detector.items())})"
            if alarms
            else ""
        )
    )
    for ex in s.clean_examples[:5]:
        print(f"    {ex}")
    return [
        (
            f"zero false alarms on always-heterogeneous runs "
            f"({alarms} over {s.clean_steps:,} steps)",
            alarms == 0,
        )
    ]


def report_edges(trials: Sequence[Trial]) -> None:
    """Edge cases outside the issue's fault list: what the detectors said, no target."""
    print("")
    print("Edge cases (informational; not part of any target)")
    teardown = [t for t in trials if t.scenario == "crash_teardown"]
    if teardown:
        s = score(teardown).by_scenario["crash_teardown"]
        said: dict[str, int] = defaultdict(int)
        for t in teardown:
            culprit = set(t.faults[0].ranks)
            crash = [a for a in t.alerts if a.kind == "crash"]
            if not crash:
                said["no finding"] += 1
            elif set(crash[0].ranks) == culprit:
                said["crash naming the culprit"] += 1
            elif culprit < set(crash[0].ranks):
                first = crash[0].key == f"crash:{min(culprit)}"
                said[f"crash naming every rank{' (key: the culprit)' if first else ''}"] += 1
            else:
                said[f"crash naming {_short(crash[0].ranks)}"] += 1
        print(
            f"  crash, then the launcher kills the survivors 0.2–3 s later (no goodbye): "
            f"{s.detected} of {s.injected} named exactly; "
            + "; ".join(f"{v}× {k}" for k, v in sorted(said.items()))
        )
    ckpt = [t for t in trials if t.scenario == "clean_checkpoints"]
    if ckpt:
        sc = score(ckpt)
        n_ckpt = sum(max(0, (t.job_steps - 1) // 400) for t in ckpt)
        fps = sum(sc.clean_fp_by_detector.values())
        print(
            f"  clean runs with synchronous checkpoints (20–120 s pause every 400 steps, "
            f"{n_ckpt} pauses over {sc.clean_steps:,} steps): {fps} alarms "
            + (
                "("
                + ", ".join(f"{k} {v}" for k, v in sorted(sc.clean_fp_by_detector.items()))
                + ")"
                if fps
                else ""
            )
        )
        for ex in sc.clean_examples[:3]:
            print(f"    {ex}")


if __name__ == "__main__":
    sys.exit(main())

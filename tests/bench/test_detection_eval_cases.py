"""The evaluation's issue-15 cases run and score what they claim: group stragglers replayed
with carried baselines, always-heterogeneous clean runs, arrival orders against the in-order
replay, and the real cases (``bench/detection_eval.py``, ``bench/eval_arrival.py``,
``bench/eval_real.py``). Small inputs: the whole file takes a few seconds."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bench import eval_arrival, eval_real
from bench.detection_eval import (
    GROUP_STEPS,
    GROUP_TAIL,
    Trial,
    make_faults,
    report_group,
    run_trial,
    stream_windows,
)
from bench.replay import (
    Alert,
    Baselines,
    IncidentTracker,
    Outcome,
    ServerView,
    Telemetry,
    backend_window,
)
from bench.simulate import Fault, JobConfig, simulate
from detectors.finding import Finding

T0 = JobConfig().t0


def test_a_group_straggler_is_one_fault_per_rank_with_one_onset_and_magnitude() -> None:
    cfg = JobConfig(ranks=16, steps=GROUP_STEPS)
    for seed in range(20):
        faults = make_faults("straggler_group", np.random.default_rng(seed), cfg)
        assert 4 <= len(faults) <= 7  # a quarter to 45% of 16 ranks
        assert all(f.kind == "straggler" and len(f.ranks) == 1 for f in faults)
        assert len({f.ranks for f in faults}) == len(faults)
        assert len({(f.onset_step, f.magnitude, f.duration) for f in faults}) == 1
        f = faults[0]
        assert 200 <= f.onset_step <= GROUP_STEPS - GROUP_TAIL and f.duration is None
        assert 1.1 <= f.magnitude <= 1.3


def test_streamed_windows_keep_naming_a_group_after_the_window_slides_past_its_onset() -> None:
    group = (1, 4, 6, 9, 13)
    cfg = JobConfig(ranks=16, steps=500, seed=2, step_s=0.3, jitter=0.02)
    run = simulate(cfg, [Fault("straggler", (r,), 200, magnitude=1.2) for r in group])
    alerts = [a for a in stream_windows(run, interval_s=2.0, phase=0.5) if a.kind == "straggler"]
    assert sorted(a.ranks[0] for a in alerts) == list(group)  # once each, nothing else
    # 300 steps after the onset the window no longer holds it: still named (carried baselines).
    assert all(a.closed_time is None for a in alerts)
    assert all(abs((a.first_step or 0) - (cfg.first_step + 200)) <= 3 for a in alerts)


def test_an_always_heterogeneous_clean_run_raises_no_alarm() -> None:
    trial = run_trial(
        "clean_heterogeneous",
        seed=0,
        index=0,
        ranks=16,
        steps=400,
        detect_interval=2.0,
        sweep_interval=2.0,
    )
    assert trial.faults == () and trial.alerts == []


def test_baselines_are_learned_once_and_handed_back_to_later_windows() -> None:
    keeper = Baselines(4)
    early = np.ones((4, 100))  # learn_steps: the first window with that many steps
    early[2] *= 1.05
    w = backend_window(keeper, steps=range(100), ranks=range(4), step_time=early, live_ranks=4)
    assert w.straggler_baseline is not None
    assert w.straggler_baseline[2] == pytest.approx(1.05)
    later = np.ones((4, 100))
    later[2] *= 1.4  # slow for the whole later window: not its normal
    w = backend_window(keeper, steps=range(200, 300), ranks=range(4), step_time=later, live_ranks=4)
    assert w.straggler_baseline is not None
    assert w.straggler_baseline[2] == pytest.approx(1.05)


def test_windows_carry_the_ranks_the_open_straggler_incidents_name() -> None:
    """As ``backend.detection.baselines.attach_named`` does: the first step of each rank's
    open straggler incident, NaN where it has none; gone once the incident resolves."""
    tracker = IncidentTracker({"straggler", "slowdown"})
    named = Finding("straggler", "warning", (2,), 105, 5.0, "", "straggler:2", {}, True)
    other = Finding("slowdown", "warning", (), 101, 5.0, "", "slowdown", {}, True)
    tracker.apply([named, other], step=110, now=1.0)
    keeper, times = Baselines(4), np.ones((4, 100))
    w = backend_window(
        keeper, steps=range(100), ranks=range(4), step_time=times, live_ranks=4, incidents=tracker
    )
    assert w.straggler_since is not None
    assert np.array_equal(w.straggler_since, [np.nan, np.nan, 105, np.nan], equal_nan=True)
    tracker.apply([other], step=111, now=2.0)  # the straggler's incident resolves
    w = backend_window(
        keeper, steps=range(100), ranks=range(4), step_time=times, live_ranks=4, incidents=tracker
    )
    assert w.straggler_since is not None and np.isnan(w.straggler_since).all()


def _tiny(ranks: int = 4, steps: int = 12, chunk: int = 3) -> Telemetry:
    times = np.arange(ranks * steps, dtype=float).reshape(ranks, steps) + 1.0
    return Telemetry("tiny", np.arange(steps) + 100, times, None, chunk, frozenset({1}), 105)


def test_the_server_view_is_the_last_steps_any_rank_reported_with_gaps_as_nan() -> None:
    job = _tiny()
    view = ServerView(job)
    assert view.window() is None
    view.land((0, 0, 2))  # rank 0's first two batches (steps 100-105)
    view.land((2, 1, 2))  # rank 2's second (103-105)
    seen = view.window(width=4)
    assert seen is not None
    steps, ranks, times, comm = seen
    assert steps.tolist() == [102, 103, 104, 105] and ranks.tolist() == [0, 2] and comm is None
    assert np.isnan(times[1, 0]) and times[1, 1] == job.step_time[2, 3]


@pytest.mark.parametrize("order", list(eval_arrival.ORDERS), ids=str)
def test_every_arrival_order_delivers_each_batch_exactly_once(order: str) -> None:
    job = _tiny(ranks=8, steps=60, chunk=5)
    batches = list(eval_arrival.ORDERS[order](job, np.random.default_rng(0)))
    cells = Counter((r, c) for r, lo, hi in batches for c in range(lo, hi))
    assert set(cells) == {(r, c) for r in range(8) for c in range(12)}
    assert set(cells.values()) == {1}
    assert [b for b in batches if b[2] - b[1] > eval_arrival.BURST_FLUSHES + 1] == []


def test_findings_differ_when_a_rank_is_added_an_onset_moves_or_an_incident_reopens() -> None:
    job = _tiny(steps=60, chunk=5)
    ref = Outcome(opened={1: [110]})
    assert eval_arrival.compare(job, ref, Outcome(opened={1: [114]})) == ((), 4)
    problems, shift = eval_arrival.compare(job, ref, Outcome(opened={1: [117], 3: [120]}))
    assert shift == 7 and len(problems) == 2  # rank 3 named, onset moved by 7 steps
    problems, _ = eval_arrival.compare(job, ref, Outcome(opened={1: [110, 130]}))
    assert problems == ("1 incident(s) re-opened (0 in order)",)


def test_a_simulated_group_gives_the_same_findings_in_every_arrival_order() -> None:
    case = eval_arrival.evaluate(eval_arrival.simulated_job(16, steps=300), per_run=4)
    assert case.truth_ok, case.truth_text
    assert [v.order for v in case.verdicts if not v.equal] == []
    assert all(v.outcome.held > 0 for v in case.verdicts)  # partial tails were held back


def test_the_real_cases_name_their_truth() -> None:
    pai, fr, kineto = (
        eval_real.eval_pai(),
        eval_real.eval_flight_recorder(),
        eval_real.eval_kineto(),
    )
    assert pai.ok and pai.found == "rank 6 from step 1811 (1 incident(s))"
    assert fr.ok and fr.found == "hang [9, 14]"
    assert kineto.ok and kineto.found.startswith("rank 2 from step ")


def _stalled_job(now: float) -> dict[str, object]:
    """What the server stores of a 4-rank job whose rank 2 stopped outside any collective
    100 s ago while the others wait in the all-reduce (heartbeats go on)."""
    waiting = {"group": "world", "op": "all_reduce", "seq": 5, "since": now - 100}
    return {
        "now": now,
        "ranks": [
            {
                "rank": r,
                "last_step": 4,
                "current_step": 5,
                "last_step_ts": now - 101,
                "last_heartbeat_ts": now - 0.5,
                "inflight": None if r == 2 else waiting,
            }
            for r in range(4)
        ],
        "groups": {},
        "step_durations": [1.0] * 8,
        "expect_running": True,
    }


def test_pipeline_hang_cases_are_judged_by_the_sweep_and_their_dumps(tmp_path: Path) -> None:
    assert eval_real.eval_pipeline_hangs(tmp_path) == []
    cases = {
        "stop": {"truth": [2], "server": _stalled_job(T0)},
        "dumps": {"truth": [9, 14]},
        "wrong": {"truth": [3]},
    }
    for name, case in cases.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "case.json").write_text(json.dumps(case))
        if name != "stop":
            shutil.copytree(eval_real.FR_DIR, tmp_path / name / "fr")
    judged = eval_real.eval_pipeline_hangs(tmp_path)
    assert [(c.name, c.found, c.ok) for c in judged] == [
        ("pipeline hang dumps, Flight Recorder", "hang [9, 14]", True),
        ("pipeline hang stop", "hang [2]", True),
        ("pipeline hang wrong, Flight Recorder", "hang [9, 14]", False),
    ]


def test_the_group_report_counts_ranks_named_at_the_end_and_reopened_incidents() -> None:
    faults = tuple(
        Fault("straggler", (r,), 200, magnitude=1.2, onset_time=T0 + 200) for r in (2, 5)
    )

    def alert(rank: int, opened: int, closed: float | None) -> Alert:
        return Alert(
            detector="straggler",
            kind="straggler",
            key=f"straggler:{rank}",
            ranks=(rank,),
            first_step=200,
            opened_step=opened,
            opened_time=T0 + opened,
            closed_time=closed,
        )

    trial = Trial(
        scenario="straggler_group",
        seed=0,
        ranks=16,
        first_step=0,
        median_step_s=1.0,
        faults=faults,
        alerts=[alert(2, 205, None), alert(5, 206, T0 + 300), alert(5, 320, T0 + 400)],
        job_steps=500,
        last_progress=T0 + 500,
    )
    results = dict(report_group([trial]))
    assert results["group stragglers flagged ≤ 10 steps after onset (max 6)"]
    assert not results["group stragglers still named at the end of the run (1 of 2)"]
    assert not results["group stragglers: no incident re-opened (1)"]

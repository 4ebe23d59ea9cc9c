"""The evaluation's simulator keeps synchronous semantics and honest ground truth, and its
scoring counts true and false positives the way ``bench/detection_eval.py`` documents."""

from __future__ import annotations

import numpy as np
import pytest

from bench.detection_eval import Alert, IncidentTracker, Trial, matches, score
from bench.simulate import Fault, JobConfig, rank_states, simulate
from detectors.finding import Finding

T0 = JobConfig().t0


def test_every_rank_sees_the_same_step_time_and_the_slowest_waits_least() -> None:
    run = simulate(JobConfig(ranks=32, steps=120, seed=3))
    assert (run.step_time == run.step_time[0]).all()
    arrival = run.compute + run.data_time
    # comm = step - compute - data, never negative; the last to arrive waits least.
    np.testing.assert_allclose(run.comm_time, run.step_time - arrival)
    assert (run.comm_time > 0).all()
    assert (run.comm_time.argmin(axis=0) == arrival.argmax(axis=0)).all()
    # The step is the slowest rank's compute + data, plus at least the transfers.
    assert (run.step_time[0] > arrival.max(axis=0)).all()
    np.testing.assert_allclose(run.step_end - run.step_start, run.step_time[0], atol=1e-6)
    np.testing.assert_allclose(run.step_start[1:], run.step_end[:-1], rtol=0, atol=1e-6)


def test_min_member_duration_is_the_transfer_and_a_slow_link_stretches_it() -> None:
    cfg = JobConfig(ranks=32, steps=200, seed=4, net_jitter=0.0, burst_prob=0.0)
    run = simulate(cfg, [Fault("slow_link", (10,), onset_step=100, magnitude=3.0)])
    tp_min = run.tp_dur.min(axis=1)  # (groups, steps)
    dp_min = run.dp_dur.min(axis=1)
    before, after = slice(0, 100), slice(100, 200)
    # Rank 10 is in tp-1 and dp-2: exactly those groups' transfers triple.
    np.testing.assert_allclose(tp_min[1, after] / np.median(tp_min[1, before]), 3.0, rtol=0.03)
    np.testing.assert_allclose(dp_min[2, after] / np.median(dp_min[2, before]), 3.0, rtol=0.03)
    others = np.delete(tp_min, 1, axis=0)
    np.testing.assert_allclose(others[:, after] / np.median(others[:, before]), 1.0, rtol=0.03)
    assert run.groups()["tp-1"] == list(range(8, 16))
    assert run.groups()["dp-2"] == [2, 10, 18, 26]


def test_straggler_ground_truth_matches_the_data() -> None:
    run = simulate(
        JobConfig(ranks=16, steps=200, seed=5, gc_prob=0.0),
        [Fault("straggler", (6,), onset_step=80, duration=30, magnitude=1.6)],
    )
    (f,) = run.faults
    assert f.onset_time == run.step_start[80] and f.end_step == 109
    ratio = run.compute[6] / np.median(run.compute, axis=0)
    assert np.median(ratio[80:110]) == pytest.approx(1.6, rel=0.05)
    assert np.median(ratio[:80]) < 1.1 and np.median(ratio[110:]) < 1.1
    assert (run.comm_time[:, 80:110].argmin(axis=0) == 6).all()


def test_hang_stops_the_job_and_states_show_the_culprit_outside_any_collective() -> None:
    run = simulate(
        JobConfig(ranks=16, steps=100, seed=6), [Fault("hang", (5,), 60, variant="idle")]
    )
    assert run.n_steps == 60 and run.step_time.shape == (16, 60)
    states = {s.rank: s for s in rank_states(run, run.last_progress + 30.0)}
    assert states[5].inflight is None
    # Its tp-0 peers wait for it in tp-0; tp-1 finished its all-reduce and waits in dp.
    waits = {r: s.inflight.group for r, s in states.items() if s.inflight is not None}
    assert waits == {r: "tp-0" if r < 8 else f"dp-{r % 8}" for r in range(16) if r != 5}
    assert all(s.last_step_ts == run.last_progress for s in states.values())
    # Heartbeats go on: every rank was heard from within a heartbeat interval.
    now = run.last_progress + 30.0
    assert all(now - s.last_heartbeat_ts <= 1.0 for s in states.values())


def test_crash_silences_the_rank_and_a_clean_end_says_goodbye() -> None:
    run = simulate(JobConfig(ranks=16, steps=100, seed=7), [Fault("crash", (3,), 50)])
    (f,) = run.faults
    assert run.n_steps == 50 and run.stall is not None
    assert f.onset_time is not None and run.last_progress <= f.onset_time < run.last_progress + 1
    states = {s.rank: s for s in rank_states(run, f.onset_time + 20.0)}
    assert states[3].last_heartbeat_ts <= f.onset_time
    assert all(s.last_heartbeat_ts > f.onset_time + 18.0 for r, s in states.items() if r != 3)

    clean = simulate(JobConfig(ranks=16, steps=50, seed=8))
    assert len(rank_states(clean, clean.last_progress - 0.1)) == 16
    assert rank_states(clean, clean.last_progress + 1.0) == []  # all said goodbye
    assert len(rank_states(clean, clean.last_progress + 1.0, drop_exited=False)) == 16


def test_same_seed_same_run() -> None:
    a = simulate(JobConfig(ranks=16, steps=50, seed=9))
    b = simulate(JobConfig(ranks=16, steps=50, seed=9))
    np.testing.assert_array_equal(a.step_time, b.step_time)
    np.testing.assert_array_equal(a.loss, b.loss)


# --- scoring ---------------------------------------------------------------------------------


def alert(
    kind: str, ranks: tuple[int, ...], *, step: int, first: int, key: str = "", at: float = 0.0
) -> Alert:
    return Alert(
        detector="x",
        kind=kind,
        key=key or f"{kind}:{','.join(map(str, ranks))}",
        ranks=ranks,
        first_step=first,
        opened_step=step,
        opened_time=T0 + (at or step),  # one second per step unless told
    )


def trial(scenario: str, faults: list[Fault], alerts: list[Alert], steps: int = 1000) -> Trial:
    return Trial(
        scenario=scenario,
        seed=0,
        ranks=16,
        first_step=0,
        median_step_s=1.0,
        faults=tuple(faults),
        alerts=alerts,
        job_steps=steps,
        last_progress=T0 + steps,
    )


def test_scoring_counts_true_and_false_positives_on_a_hand_built_case() -> None:
    strag = Fault("straggler", (3,), onset_step=100, magnitude=1.5, onset_time=T0 + 100)
    slow = Fault(
        "slowdown", (), onset_step=300, magnitude=1.5, component="data", onset_time=T0 + 300
    )
    trials = [
        trial(
            "straggler_persistent",
            [strag],
            [
                alert("straggler", (3,), step=96, first=90),  # before the onset: FP
                alert("straggler", (3,), step=105, first=100),  # TP, 5 steps late
                alert("straggler", (3,), step=160, first=150),  # the same fault again: duplicate
                alert("straggler", (4,), step=106, first=100),  # wrong rank: FP
                alert("slowdown", (), step=110, first=100, key="slowdown:comm"),  # consequence
            ],
        ),
        trial(
            "slowdown",
            [slow],
            [
                alert("slowdown", (), step=309, first=301, key="slowdown:comm"),  # wrong cause
                alert("slowdown", (), step=312, first=301, key="slowdown:data"),  # TP
            ],
        ),
        trial(
            "straggler_transient", [Fault("straggler", (9,), 50, 30, 2.0, onset_time=T0 + 50)], []
        ),
        trial("clean", [], [alert("straggler", (1,), step=500, first=490)], steps=5000),
    ]
    s = score(trials)

    p = s.by_scenario["straggler_persistent"]
    assert (p.injected, p.detected, p.tp, p.duplicates) == (1, 1, 1, 1)
    assert p.latency_steps == [5] and p.latency_s == [pytest.approx(5.0)]
    assert p.onset_error_steps == [0]
    assert s.fp_by_kind["straggler"] == 3  # early, wrong rank, clean
    assert s.consequences == {"slowdown": 1}
    assert s.precision("straggler_persistent") == pytest.approx(1 / 4)
    assert s.recall("straggler_persistent") == 1.0
    t = s.by_scenario["straggler_transient"]
    assert (t.injected, t.detected) == (1, 0) and len(t.misses) == 1
    assert s.recall("straggler_transient") == 0.0

    d = s.by_scenario["slowdown"]
    assert (d.injected, d.detected, d.tp) == (1, 1, 1)
    assert s.fp_by_kind["slowdown"] == 1
    assert s.precision("slowdown") == pytest.approx(0.5)
    assert d.latency_steps == [12]

    assert s.clean_steps == 5000 and s.clean_fp_by_detector == {"x": 1}


def test_hang_matches_its_culprit_set_and_transient_onsets_must_fall_in_the_episode() -> None:
    hang = Fault("hang", (2, 9), onset_step=200, variant="idle", onset_time=T0 + 200)
    t = trial("hang", [hang], [], steps=200)
    assert matches(alert("hang", (2, 9), step=199, first=200, at=212), hang, t)
    assert not matches(alert("hang", (2,), step=199, first=200, at=212), hang, t)
    assert not matches(alert("crash", (2, 9), step=199, first=200, at=212), hang, t)
    assert not matches(alert("hang", (2, 9), step=150, first=150, at=150), hang, t)  # too early
    transient = Fault("straggler", (5,), 100, duration=30, magnitude=1.5, onset_time=T0 + 100)
    t2 = trial("straggler_transient", [transient], [])
    assert matches(alert("straggler", (5,), step=110, first=100), transient, t2)
    assert not matches(alert("straggler", (5,), step=200, first=180), transient, t2)


def finding(
    key: str, *, active: bool = True, first: int = 10, ranks: tuple[int, ...] = (1,)
) -> Finding:
    kind = key.split(":", 1)[0]
    return Finding(
        kind=kind,
        severity="warning",
        ranks=ranks,
        first_step=first,
        score=1.0,
        summary="",
        key=key,
        active=active,
    )


def test_incident_tracker_opens_once_per_episode_like_the_backend() -> None:
    tr = IncidentTracker({"straggler"})
    tr.apply([finding("straggler:1")], step=20, now=1.0)
    tr.apply([finding("straggler:1", ranks=(1,))], step=21, now=2.0)  # same incident
    tr.apply([finding("straggler:1", active=False)], step=40, now=3.0)  # resolves it
    tr.apply([finding("straggler:1", active=False)], step=41, now=4.0)  # known episode
    assert len(tr.alerts) == 1 and not tr.open
    tr.apply([finding("straggler:1", first=60)], step=70, now=5.0)  # a new episode
    tr.apply([], step=80, now=6.0)  # gone: resolved
    assert len(tr.alerts) == 2 and not tr.open
    tr.apply([finding("straggler:2", active=False, first=90)], step=95, now=7.0)
    assert len(tr.alerts) == 3 and not tr.open  # an episode already over, recorded once

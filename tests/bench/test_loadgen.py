"""The load generator's simulated job keeps synchronous-training semantics and its faults
look to Vigil's own detectors like the real thing (so a load run that misses a fault points
at the platform, not at the generator); fault specs, CPU accounting and the judgement of
incidents do what ``bench/loadgen`` documents."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from datetime import UTC, datetime

import numpy as np
import pytest

from bench.loadgen.faults import Fault, FaultSpecError, bound_s, check_faults, parse_faults
from bench.loadgen.job import Shape, SimJob
from bench.loadgen.probes import CpuProbe, psycopg_url
from bench.loadgen.report import judge
from detectors.hang import detect as detect_hang
from detectors.numerics import detect_numerics
from detectors.straggler import detect_stragglers
from detectors.window import Inflight, RankState

T0 = 1_000_000.0


def _arrays(job: SimJob, ranks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    steps = np.arange(job.completed)
    step_time = np.empty((ranks, job.completed))
    comm = np.empty_like(step_time)
    for r in range(ranks):
        for s in steps:
            ev = job.events(r, int(s))[0]
            step_time[r, s], comm[r, s] = ev["duration_s"], ev["comm_s"]
    return steps, step_time, comm


def _states(job: SimJob, ranks: int, now: float) -> list[RankState]:
    """What the server's rank rows would say after every rank's latest batch."""
    out = []
    last = job.completed - 1
    last_ts = job.events(0, last)[0]["ts"]
    for r in range(ranks):
        beat = job.heartbeat(r, now)
        if beat is None:  # crashed: its last heartbeat came before the stall
            beat = {"ts": job.stall.at - 0.5, "step": job.completed}  # type: ignore[union-attr]
        inflight = beat.get("inflight")
        out.append(
            RankState(
                rank=r,
                last_step=last,
                current_step=beat["step"],
                last_step_ts=last_ts,
                last_heartbeat_ts=beat["ts"],
                inflight=Inflight(**inflight) if inflight else None,
            )
        )
    return out


def _groups(job: SimJob, ranks: int) -> dict[str, list[int]]:
    groups = {}
    for r in range(ranks):
        for ev in job.events(r, 0)[1:]:
            if "members" in ev:
                groups[ev["group"]] = ev["members"]
    return groups


def test_every_rank_has_the_same_step_time_and_the_straggler_waits_least() -> None:
    shape = Shape(ranks=32, tp=4, step_s=1.0)
    job = SimJob(shape, t0=T0, faults=[Fault("straggler", 30.0, (7,), factor=1.5)])
    job.advance(T0 + 60)
    steps, step_time, comm = _arrays(job, 32)
    assert (step_time == step_time[0]).all()
    assert step_time[0, 10] == pytest.approx(1.0)
    onset = int(np.argmax(step_time[0] > 1.01))
    assert 29 <= onset <= 31 and step_time[0, onset] > 1.3  # the job slows down with it
    assert (comm[:, onset:].argmin(axis=0) == 7).all()  # the slow rank waits least
    assert comm[np.arange(32) != 7, onset:].min() > comm[:, :onset].max()  # the others, longer
    # the collective aggregates add up to the step's comm time
    evs = job.events(5, onset)
    assert sum(e["duration_s"] for e in evs[1:]) == pytest.approx(evs[0]["comm_s"])
    [finding] = detect_stragglers(steps, step_time, comm)
    assert finding.ranks == (7,) and onset <= finding.first_step <= onset + 1


@pytest.mark.parametrize("tp", [1, 8])
def test_a_hang_names_the_rank_in_no_collective(tp: int) -> None:
    ranks = 64
    job = SimJob(Shape(ranks=ranks, tp=tp), t0=T0, faults=[Fault("hang", 30.2, (13,))])
    job.advance(T0 + 45)
    assert job.completed == 30  # step 30 was running at 30.2 s and never ends
    now = T0 + 45
    assert job.heartbeat(13, now) == {"type": "heartbeat", "ts": now, "step": 30, "pid": 10_013}
    waits = {job.heartbeat(r, now)["inflight"]["group"] for r in range(ranks) if r != 13}
    assert waits == ({"world"} if tp == 1 else {"tp-1"} | {f"dp-{j}" for j in range(8)})
    durations = [job.events(0, s)[0]["duration_s"] for s in range(job.completed)]
    [finding] = detect_hang(
        _states(job, ranks, now),
        now=now,
        step_durations=durations,
        groups=_groups(job, ranks) or None,
    )
    assert (finding.kind, finding.ranks, finding.first_step) == ("hang", (13,), 30)


def test_a_crashed_rank_goes_silent_and_is_the_crash() -> None:
    ranks = 32
    job = SimJob(Shape(ranks=ranks, tp=4), t0=T0, faults=[Fault("crash", 20.5, (9,))])
    job.advance(T0 + 30)
    assert job.crashed(9) and job.heartbeat(9, T0 + 30) is None
    assert job.heartbeat(8, T0 + 30)["inflight"]["group"] == "tp-2"  # its peers wait for it
    durations = [1.0] * job.completed
    found = detect_hang(
        _states(job, ranks, T0 + 30),
        now=T0 + 30,
        step_durations=durations,
        groups=_groups(job, ranks),
    )
    assert [(f.kind, f.ranks) for f in found] == [("crash", (9,))]


def test_nan_starts_on_the_named_rank_and_spreads_the_next_step() -> None:
    job = SimJob(Shape(ranks=8), t0=T0, faults=[Fault("nan", 10.0, (3,))])
    job.advance(T0 + 15)
    loss = np.array([[job.events(r, s)[0]["loss"] for s in range(15)] for r in range(8)])
    first = int(np.argmax(np.isnan(loss).any(axis=0)))
    assert first == 10 and np.isnan(loss[:, first]).tolist() == [r == 3 for r in range(8)]
    assert np.isnan(loss[:, first + 1 :]).all() and np.isfinite(loss[:, :first]).all()
    [finding] = [f for f in detect_numerics(loss) if f.kind == "nan"]
    assert finding.ranks == (3,) and finding.first_step == 10


def test_a_second_stall_joins_the_first() -> None:
    faults = [Fault("hang", 5.5, (1,)), Fault("crash", 9.0, (2,))]
    job = SimJob(Shape(ranks=8), t0=T0, faults=faults)
    job.advance(T0 + 8)
    assert job.stall is not None and not job.crashed(2)
    job.advance(T0 + 10)
    assert job.crashed(2) and job.completed == 5


def test_fault_specs_parse_and_bad_ones_name_their_part() -> None:
    [f] = parse_faults("straggler@1.5m:ranks=3+5-6:factor=2")
    assert (f.kind, f.at_s, f.ranks, f.factor, f.job) == ("straggler", 90.0, (3, 5, 6), 2.0, 0)
    assert parse_faults(" ") == []
    for bad, says in [
        ("slow@10s:rank=1", "kind must be one of"),
        ("hang@10s", "needs rank=N"),
        ("hang@10s:rank=x", "must be numbers"),
        ("hang@10s:rank=1:color=red", "unknown option 'color=red'"),
        ("straggler@10s:rank=1:factor=1.01", "factor must be in"),
        ("hang@ten", "expected KIND@TIME"),
    ]:
        with pytest.raises(FaultSpecError, match=says):
            parse_faults(bad)
    with pytest.raises(FaultSpecError, match="the jobs have 8 ranks"):
        check_faults(parse_faults("hang@1:rank=8"), ranks=8, jobs=1)
    with pytest.raises(FaultSpecError, match="1 job"):
        check_faults(parse_faults("hang@1:rank=1:job=1"), ranks=8, jobs=1)
    assert bound_s(Fault("hang", 0, (1,)), step_s=4.0) == 30.0  # max(5 × 4 s, 10 s) + 10 s
    assert bound_s(Fault("crash", 0, (1,)), step_s=1.0) == 15.0


def _incident(i: int, kind: str, ranks: list[int], at: float) -> dict[str, object]:
    when = datetime.fromtimestamp(at, tz=UTC).isoformat().replace("+00:00", "Z")
    return {"id": i, "kind": kind, "ranks": ranks, "detected_at": when}


def test_judge_wants_the_right_kind_and_ranks_within_the_bound() -> None:
    faults = [Fault("hang", 10.0, (4,)), Fault("straggler", 10.0, (1, 2)), Fault("crash", 30, (5,))]
    incidents = {
        0: [
            _incident(1, "crash", [0, 3], T0 + 12),  # wrong: nothing crashed there
            _incident(2, "hang", [4], T0 + 35),  # right ranks, 25 s: past the 20-s bound
            _incident(3, "straggler", [1], T0 + 15),
            _incident(4, "straggler", [2], T0 + 18),
            _incident(5, "crash", [5, 6], T0 + 33),  # one rank too many
            _incident(6, "slowdown", [], T0 + 14),
        ]
    }
    verdict = judge(faults, incidents, t0=T0, step_s=1.0)
    hang, straggler, crash = verdict["faults"]
    assert (hang["found"], hang["lag_s"], hang["within_bound"]) == (True, 25.0, False)
    assert (straggler["found"], straggler["lag_s"], straggler["within_bound"]) == (True, 8.0, True)
    assert not crash["found"] and crash["seen"] == [{"kind": "crash", "ranks": [5, 6]}]
    assert [i["id"] for i in verdict["unexpected"]] == [1, 5]
    assert [i["kind"] for i in verdict["other"]] == ["slowdown"]


def test_cpu_probe_counts_a_process_tree_and_its_exited_children() -> None:
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys, time\n"
            f"subprocess.run([sys.executable, '-c', {burn!r}])\ntime.sleep(30)",
        ]
    )
    try:
        probe = CpuProbe({"tree": str(parent.pid), "none": "re:^no-such-process-anywhere$"})
        deadline = time.monotonic() + 20
        while (got := probe.seconds())["tree"] < 0.3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert got["tree"] >= 0.3  # the child exited: its time is in the parent's cutime
        assert got["none"] == 0.0 and got["loadgen"] > 0
    finally:
        parent.kill()
        parent.wait()
    assert probe.interval({"tree": 5.0}) == {"tree": 0.0}
    assert probe.interval({"tree": 4.0}) == {"tree": 0.0}  # a dip is clamped, not negative
    assert probe.interval({"tree": 6.5}) == {"tree": 2.5}
    assert math.isclose(probe.total["tree"], 2.5)
    assert psycopg_url("postgresql+psycopg://u@h:5432/d") == "postgresql://u@h:5432/d"

"""Hang and crash detection from per-rank latest state, with known answers."""

from __future__ import annotations

import math

import pytest

from detectors.hang import (
    HangConfig,
    Inflight,
    RankState,
    detect,
    learn_timeout,
    terminal_components,
)

NOW = 10_000.0
FAST = [0.30, 0.32, 0.31, 0.35]  # learned timeout: floor 10 s


def state(
    rank: int,
    inflight: Inflight | None = None,
    *,
    step: int = 120,
    last_step_ts: float = NOW - 60,
    heartbeat_ts: float = NOW - 0.5,
) -> RankState:
    return RankState(
        rank=rank,
        last_step=step - 1,
        current_step=step,
        last_step_ts=last_step_ts,
        last_heartbeat_ts=heartbeat_ts,
        inflight=inflight,
    )


def coll(group: str, seq: int, op: str = "all_reduce", since: float = NOW - 59) -> Inflight:
    return Inflight(group=group, op=op, seq=seq, since=since)


# --- learned timeout -------------------------------------------------------------------------


def test_timeout_is_floor_for_fast_steps() -> None:
    t = learn_timeout(FAST)
    assert t.seconds == 10.0 and t.source == "floor" and t.slowest_step_s == 0.35


def test_timeout_scales_with_step_time() -> None:
    t = learn_timeout([40.0, 60.0, 55.0])  # 4.5 x median 55 s
    assert t.seconds == pytest.approx(247.5) and t.source == "learned" and t.n_steps == 3
    # An occasional slow step (evaluation, …) still bounds it from below: 1.5 x slowest.
    assert learn_timeout([1.0] * 20 + [30.0]).seconds == pytest.approx(45.0)


def test_timeout_ignores_bad_values_and_has_a_default() -> None:
    assert learn_timeout([math.nan, -1.0, 0.0, math.inf, 4.0]).seconds == 18.0
    t = learn_timeout([])
    assert t.source == "no_history" and t.seconds == HangConfig().no_history_timeout_s


def test_fast_job_is_flagged_sooner_than_a_slow_one() -> None:
    # Same picture for both jobs: rank 3 is out of the collective, no step for 30 s.
    ranks = [state(r, coll("dp", 7), last_step_ts=NOW - 30) for r in range(3)]
    ranks.append(state(3, last_step_ts=NOW - 30))
    fast = detect(ranks, now=NOW, step_durations=FAST)
    slow = detect(ranks, now=NOW, step_durations=[50.0, 60.0])
    assert [f.ranks for f in fast] == [(3,)]
    assert slow == []
    later = [state(r, s.inflight, last_step_ts=NOW - 400) for r, s in enumerate(ranks)]
    (f,) = detect(later, now=NOW, step_durations=[50.0, 60.0])
    assert f.ranks == (3,) and f.evidence["timeout_s"] == pytest.approx(247.5)
    assert f.evidence["timeout_source"] == "learned"


# --- healthy and stopped jobs ----------------------------------------------------------------


def test_healthy_job_has_no_findings() -> None:
    ranks = [state(r, coll("dp", 7), last_step_ts=NOW - 0.2) for r in range(8)]
    assert detect(ranks, now=NOW, step_durations=FAST) == []


def test_slow_step_within_timeout_is_not_a_hang() -> None:
    ranks = [state(r, last_step_ts=NOW - 8.0) for r in range(4)]  # 8 s < floor 10 s
    assert detect(ranks, now=NOW, step_durations=FAST) == []


def test_all_ranks_silent_together_is_a_stopped_job() -> None:
    ranks = [state(r, heartbeat_ts=NOW - 600 - r * 0.1, last_step_ts=NOW - 601) for r in range(8)]
    assert detect(ranks, now=NOW, step_durations=FAST) == []
    assert detect(ranks, now=NOW, step_durations=FAST, finished=True) == []
    (f,) = detect(ranks, now=NOW, step_durations=FAST, finished=False)
    assert f.kind == "crash" and f.ranks == tuple(range(8))


def test_finished_job_reports_nothing_even_if_stalled() -> None:
    ranks = [state(r, last_step_ts=NOW - 900) for r in range(4)]
    assert detect(ranks, now=NOW, step_durations=FAST, finished=True) == []


def test_rank_that_went_silent_well_before_the_others_is_a_crash() -> None:
    ranks = [state(r, heartbeat_ts=NOW - 100, last_step_ts=NOW - 400) for r in range(4)]
    ranks[2] = state(2, heartbeat_ts=NOW - 390, last_step_ts=NOW - 400)
    (f,) = detect(ranks, now=NOW, step_durations=FAST)
    assert f.kind == "crash" and f.ranks == (2,) and f.key == "crash:2"


# --- hangs -----------------------------------------------------------------------------------


def test_rank_not_in_the_collective_is_the_culprit() -> None:
    ranks = [state(r, coll("dp", 4502)) for r in range(8) if r != 5] + [state(5)]
    (f,) = detect(ranks, now=NOW, step_durations=FAST)
    assert (f.kind, f.severity, f.ranks, f.first_step) == ("hang", "critical", (5,), 120)
    assert f.key == "hang:step=120"
    ev = f.evidence
    assert ev["collective"] == {"group": "dp", "op": "all_reduce", "seq": 4502}
    assert ev["waiting_ranks"] == [0, 1, 2, 3, 4, 6, 7]
    assert ev["stalled_s"] == pytest.approx(60.0) and ev["timeout_s"] == 10.0
    assert ev["waiting_s"] == pytest.approx(59.0)
    assert "floor" in ev["timeout_how"]
    assert "no collective" in ev["culprit_reasons"]["5"]
    assert f.score == pytest.approx(6.0)


def test_rank_in_an_earlier_seq_of_the_group_is_the_culprit() -> None:
    ranks = [state(r, coll("dp", 4502)) for r in range(4)]
    ranks[1] = state(1, coll("dp", 4501))
    (f,) = detect(ranks, now=NOW, step_durations=FAST)
    assert f.ranks == (1,)
    assert "seq 4501" in f.evidence["culprit_reasons"]["1"]


def two_groups() -> list[RankState]:
    """tp0 = 0-3 and tp1 = 4-7; dp pairs (0,4) (1,5) (2,6) (3,7).

    Rank 6 is stuck computing. Its tp1 peers wait in tp1 seq 50; the tp0 ranks have moved on
    to their dp all-reduce and wait for their tp1 partners, who are stuck in tp1."""
    ranks = [state(r, coll(f"dp{r}", 10)) for r in range(4)]
    ranks += [state(r, coll("tp1", 50, op="all_gather")) for r in (4, 5, 7)]
    ranks.append(state(6))
    return sorted(ranks, key=lambda s: s.rank)


GROUPS = {
    "tp0": range(4),
    "tp1": range(4, 8),
    **{f"dp{i}": (i, i + 4) for i in range(4)},
}


def test_two_groups_with_membership_name_the_one_rank() -> None:
    (f,) = detect(two_groups(), now=NOW, step_durations=FAST, groups=GROUPS)
    assert f.ranks == (6,)
    # The collective most ranks wait in; ties go to the oldest, then the name.
    assert f.evidence["collective"]["group"] == "tp1"
    assert f.evidence["waiting_ranks"] == [4, 5, 7]


def test_two_groups_without_membership_still_name_the_one_rank() -> None:
    (f,) = detect(two_groups(), now=NOW, step_durations=FAST)
    assert f.ranks == (6,)


def test_p2p_waiter_points_at_its_peer() -> None:
    # Pipeline: rank 0 waits to receive from rank 1, which is stuck outside communication.
    # Ranks 2 and 3 are a matched send/recv pair (both posted): not waiting for each other.
    ranks = [
        state(0, Inflight("pp", "recv", 3, NOW - 59, peers=(1,))),
        state(1),
        state(2, Inflight("pp", "send", 3, NOW - 59, peers=(3,))),
        state(3, Inflight("pp", "recv", 3, NOW - 59, peers=(2,))),
    ]
    (f,) = detect(ranks, now=NOW, step_durations=FAST, groups={"pp": range(4)})
    assert f.ranks == (1,)
    assert f.evidence["p2p_waits"] == [[0, 1]]


def test_everyone_in_a_complete_collective_has_no_culprit() -> None:
    ranks = [state(r, coll("dp", 9)) for r in range(4)]
    (f,) = detect(ranks, now=NOW, step_durations=FAST)
    assert f.kind == "hang" and f.ranks == ()
    assert "network or a GPU" in f.summary


def test_stall_outside_any_collective_has_no_culprit() -> None:
    ranks = [state(r, last_step_ts=NOW - 400) for r in range(4)]
    (f,) = detect(ranks, now=NOW, step_durations=FAST)
    assert f.ranks == () and "outside communication" in f.evidence["note"]


def test_pause_outside_any_collective_gets_the_long_timeout() -> None:
    """A synchronous checkpoint: every rank busy outside communication for a minute."""
    ranks = [state(r, last_step_ts=NOW - 60) for r in range(4)]
    assert detect(ranks, now=NOW, step_durations=FAST) == []


def test_mismatched_collective_order_names_the_rank_behind_in_step() -> None:
    # Ranks 0-2 wait in "a"; rank 3, one step behind, waits in "b"; each waits for the other.
    ranks = [state(r, coll("a", 5), step=121) for r in range(3)]
    ranks.append(state(3, coll("b", 5), step=120))
    (f,) = detect(ranks, now=NOW, step_durations=FAST)
    assert f.ranks == (3,) and f.first_step == 120
    assert "behind in step" in f.evidence["culprit_reasons"]["3"]


# --- crashes ---------------------------------------------------------------------------------


def test_stale_heartbeat_is_a_crash_named_in_seconds() -> None:
    # Step 120 is only 3 s old: far from the hang timeout, but rank 3 is silent for 8 s.
    ranks = [state(r, coll("dp", 8), last_step_ts=NOW - 3) for r in range(8)]
    ranks[3] = state(3, heartbeat_ts=NOW - 8, last_step_ts=NOW - 9)
    (f,) = detect(ranks, now=NOW, step_durations=FAST)
    assert (f.kind, f.severity, f.ranks, f.key) == ("crash", "critical", (3,), "crash:3")
    assert f.first_step == 120
    assert f.evidence["heartbeat_timeout_s"] == 5.0
    assert f.evidence["survivors"]["hung"] is False


def test_crash_is_the_cause_and_the_survivors_hang_is_its_evidence() -> None:
    ranks = [state(r, coll("dp", 8)) for r in range(8)]
    ranks[3] = state(3, heartbeat_ts=NOW - 50)
    findings = detect(ranks, now=NOW, step_durations=FAST)
    assert [f.kind for f in findings] == ["crash"]  # no separate hang finding
    survivors = findings[0].evidence["survivors"]
    assert survivors["hung"] is True and survivors["waiting_for"] == [3]
    assert survivors["collectives"][0]["ranks"] == [0, 1, 2, 4, 5, 6, 7]


def test_heartbeat_interval_sets_the_crash_timeout() -> None:
    cfg = HangConfig(heartbeat_interval_s=10.0)
    assert cfg.heartbeat_timeout_s == 50.0
    ranks = [state(r, last_step_ts=NOW - 1) for r in range(4)]
    ranks[1] = state(1, heartbeat_ts=NOW - 30, last_step_ts=NOW - 31)
    assert detect(ranks, now=NOW, step_durations=FAST, config=cfg) == []
    assert [f.ranks for f in detect(ranks, now=NOW, step_durations=FAST)] == [(1,)]


def test_a_recent_step_counts_as_a_sign_of_life() -> None:
    ranks = [state(r, last_step_ts=NOW - 1) for r in range(4)]
    ranks[2] = state(2, heartbeat_ts=NOW - 60, last_step_ts=NOW - 1)
    assert detect(ranks, now=NOW, step_durations=FAST) == []


# --- the graph -------------------------------------------------------------------------------


def test_terminal_components() -> None:
    assert terminal_components({1: [2], 2: [3], 4: [3]}) == [frozenset({3})]
    cycle = terminal_components({1: [2], 2: [1], 3: [1]})
    assert cycle == [frozenset({1, 2})]
    big = {i: [i + 1] for i in range(20_000)}  # deep chains need no recursion
    assert terminal_components(big) == [frozenset({20_000})]


def test_complete_collective_with_membership_waits_for_nobody() -> None:
    ranks = [state(r, coll("tp0", 3)) for r in range(2)] + [state(2), state(3)]
    (f,) = detect(ranks, now=NOW, step_durations=FAST, groups={"tp0": (0, 1)})
    assert f.ranks == ()


def test_rank_blocked_in_a_complete_collective_ends_the_wait() -> None:
    # dp = {0, 1}: rank 0 waits there for rank 1, which sits in tp1 = {1, 2} with rank 2,
    # both members present: the wait ends at ranks 1 and 2 (suspect their link or GPUs).
    ranks = [state(0, coll("dp", 4)), state(1, coll("tp1", 7)), state(2, coll("tp1", 7))]
    groups = {"dp": (0, 1), "tp1": (1, 2)}
    (f,) = detect(ranks, now=NOW, step_durations=FAST, groups=groups)
    assert f.ranks == (1, 2)
    assert "all its members entered" in f.evidence["culprit_reasons"]["1"]


def test_many_groups_without_membership_stay_fast() -> None:
    # 4096 ranks in 1024 tensor-parallel groups of 4; rank 1234 is out of its group.
    ranks = [state(r, coll(f"tp{r // 4}", 11)) for r in range(4096)]
    ranks[1234] = state(1234)
    (f,) = detect(ranks, now=NOW, step_durations=FAST)
    assert f.ranks == (1234,)


def test_broadcast_root_left_behind_waits_for_the_idle_rank() -> None:
    """Seen on a real gloo job: rank 1 hangs before step 12's buffer broadcast. The root
    (rank 0) stays in the broadcast waiting for rank 1; rank 2 received its copy, moved on
    and waits in the next all-reduce. The culprit is rank 1 alone."""
    now = 1000.0
    states = [
        RankState(0, 11, 12, now - 30, now, Inflight("world", "broadcast", 26, now - 30)),
        RankState(1, 11, 12, now - 30, now, None),
        RankState(2, 11, 12, now - 30, now, Inflight("world", "all_reduce", 27, now - 30)),
    ]
    (finding,) = detect(states, now=now, step_durations=[0.15] * 30)
    assert finding.kind == "hang" and finding.ranks == (1,)

"""One dead rank must not take the ranks of other hosts with it.

Seen in load runs: with the server behind, many ranks' latest reports are two or three
seconds old at once. Once one rank was dead, every rank quiet for two heartbeat intervals
was named dead too, so one crash (real or not) named dozens of live ranks.
"""

from __future__ import annotations

import dataclasses

from detectors.hang import RankState, detect
from detectors.window import Inflight

NOW = 10_000.0
FAST = [0.30, 0.32, 0.31, 0.35]  # learned step timeout: the 10 s floor


def rank(n: int, host: str | None, quiet_s: float) -> RankState:
    """A rank outside any collective whose latest report is ``quiet_s`` old."""
    return RankState(
        rank=n,
        last_step=119,
        current_step=120,
        last_step_ts=NOW - 60,
        last_heartbeat_ts=NOW - quiet_s,
        inflight=None,
        host=host,
    )


def crashed(states: list[RankState]) -> tuple[int, ...]:
    [finding] = detect(states, now=NOW, step_durations=FAST)
    assert finding.kind == "crash"
    return finding.ranks


def test_quiet_ranks_of_another_host_are_not_named_with_the_dead_rank() -> None:
    # Rank 3 on host b is dead (8 s, past the 5 s timeout); host a's ranks are only late
    # (2.5 s: the server is behind), as their next heartbeats will show; rank 4's came in.
    states = [
        rank(0, "a", 2.5),
        rank(1, "a", 2.5),
        rank(2, "a", 2.5),
        rank(3, "b", 8.0),
        rank(4, "a", 0.4),
    ]
    assert crashed(states) == (3,)


def test_quiet_ranks_on_the_dead_ranks_host_are_named_with_it() -> None:
    # A failed node: its ranks' last heartbeats are up to an interval apart, so when the
    # first is past the timeout the others are quiet for two intervals; named at once.
    states = [
        rank(0, "a", 2.5),
        rank(1, "a", 2.5),
        rank(2, "a", 0.4),
        rank(3, "b", 8.0),
        rank(4, "b", 2.5),
        rank(5, "b", 0.4),  # reported just now: alive, whatever its host
    ]
    assert crashed(states) == (3, 4)


def test_without_known_hosts_quiet_ranks_wait_for_their_own_timeout() -> None:
    states = [rank(0, None, 2.5), rank(1, None, 2.5), rank(2, None, 8.0), rank(3, None, 0.4)]
    assert crashed(states) == (2,)


def test_steps_stored_behind_fresh_heartbeats_are_no_hang() -> None:
    """Seen at 1,024 ranks through relays with ingest ~20 s behind: heartbeats (through
    the liveness lane) said step 505 was in progress while the stored steps ended at 480,
    20 s ago; a hang opened naming nearly every rank."""
    now = 1000.0
    waiting = Inflight("world", "all_reduce", 900, now - 0.2)  # a live job: in collectives
    states = [
        RankState(r, 480, 505, now - 20.0, now - 0.5, inflight=waiting, host=f"n{r // 8}")
        for r in range(16)
    ]
    assert detect(states, now=now, step_durations=[1.0] * 50) == []
    # The same stored steps with heartbeats still in step 481: a hang, as before.
    waiting = Inflight("world", "all_reduce", 900, now - 19.0)  # rank 0 never came
    stuck = [
        dataclasses.replace(s, current_step=481, inflight=None if s.rank == 0 else waiting)
        for s in states
    ]
    assert [f.kind for f in detect(stuck, now=now, step_durations=[1.0] * 50)] == ["hang"]

"""A run's first batches arrive over a second or so: the sweep must not judge a hang from
the ranks whose state has arrived while others of the world have not reported yet.

Seen in CI (``tests/reliability/test_liveness_live.py``): a 4-rank job hung with rank 2
outside the all-reduce the others wait in; a sweep ran after ranks 0 and 1 had reported
and before ranks 2 and 3 had, saw every known rank in an all-reduce that all of them
entered, and opened the hang with no culprit.
"""

from __future__ import annotations

import time

from sqlalchemy import select

from backend.incidents.models import Incident
from tests.backend.jobs.test_runs import beat, send, sweep
from tests.factories import step

WAITING = {"group": "world", "op": "all_reduce", "seq": 900}


def hung_rank(client, rank: int, now: float) -> None:  # type: ignore[no-untyped-def]
    """Steps stopped 20 s ago; rank 2 never entered the all-reduce the others wait in."""
    steps = [step(n, ts=now - 80 + n, duration_s=0.4) for n in range(61)]
    inflight = None if rank == 2 else {**WAITING, "since": now - 19}
    send(client, [*steps, beat(now, step=61, inflight=inflight)], rank=rank, world_size=4)


def hangs(session) -> list[tuple[int, ...]]:  # type: ignore[no-untyped-def]
    session.expire_all()
    found = session.scalars(select(Incident).where(Incident.kind == "hang"))
    return [tuple(i.ranks) for i in found]


def test_a_hang_is_not_judged_before_the_ranks_of_a_starting_run_have_reported(
    client, session, settings
):
    now = time.time()
    for rank in (0, 1):
        hung_rank(client, rank, now)
    sweep(session, settings)
    assert hangs(session) == []  # ranks 2 and 3 have not reported yet: no verdict

    for rank in (2, 3):
        hung_rank(client, rank, now)
    sweep(session, settings)
    assert hangs(session) == [(2,)]


def test_ranks_that_never_report_do_not_hide_a_hang_for_long(client, session, settings):
    now = time.time()
    for rank in (0, 1):
        hung_rank(client, rank, now)
    # A heartbeat timeout after the run began, ranks 2 and 3 still silent: judged as before
    # (the hang is found; which rank to blame is not knowable from these two).
    for rank in (0, 1):
        send(client, [beat(now + 6, step=61, inflight={**WAITING, "since": now - 19})], rank=rank)
    sweep(session, settings, later_s=6)
    assert len(hangs(session)) == 1

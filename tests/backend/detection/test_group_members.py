"""Which ranks a process group has (``backend.detection.collectives.group_members``),
kept per job attempt once known: a group with no record yet is looked up again next time
(not taken as the whole world for good), records outside any step count, and a group
reported without members (the world group) is the world."""

from __future__ import annotations

from sqlalchemy import select

from backend.detection.collectives import group_members
from backend.jobs.models import Job
from tests.conftest import INGEST
from tests.factories import batch, step


def collective(n: int | None, group: str, members: list[int] | None) -> dict[str, object]:
    event: dict[str, object] = {
        "type": "collective",
        "group": group,
        "op": "all_reduce",
        "bytes": 1 << 20,
        "duration_s": 0.01,
        "count": 1,
    }
    if n is not None:
        event["step"] = n
    if members is not None:
        event["members"] = members
    return event


def post(client, events: list[dict[str, object]], rank: int = 0) -> None:  # type: ignore[no-untyped-def]
    reply = client.post("/api/v1/ingest", json=batch(events, rank=rank), headers=INGEST)
    assert reply.status_code == 200, reply.text


def test_a_group_not_seen_yet_is_looked_up_again(client, session):  # type: ignore[no-untyped-def]
    post(client, [step(1), collective(1, "world", None)])
    job = session.scalar(select(Job))
    ask = {"dp-1", "world", "pp-0"}
    assert group_members(session=session, job=job, names=ask, since_step=0) == {}

    # dp-1's first records come later (in a later step), pp-0's outside any step
    post(client, [step(2), collective(2, "dp-1", [1, 3])], rank=1)
    post(client, [collective(None, "pp-0", [0, 2])], rank=2)
    session.expire_all()
    found = group_members(session=session, job=job, names=ask, since_step=0)
    assert found == {"dp-1": [1, 3], "pp-0": [0, 2]}  # the world group: no member list

"""A heartbeat's in-flight point-to-point op carries its ``peers`` (issue 15, item 3).

Optional, so collectors that do not send it still work; stored as sent; read back by the
sweep as the detector's ``Inflight.peers``; bad values get a 422 naming the field.
"""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from backend.detection.window import load_liveness
from backend.jobs.models import Job, Rank
from tests.conftest import INGEST
from tests.factories import batch

TS = 1_732_233_000.0


def beat(inflight: dict[str, object]) -> dict[str, object]:
    return {"type": "heartbeat", "ts": TS, "step": 7, "inflight": inflight}


def test_peers_are_stored_and_reach_the_hang_detector(client, session):  # type: ignore[no-untyped-def]
    recv = {"group": "pp/2", "op": "recv", "seq": 3, "since": TS - 5, "peers": [5]}
    coll = {"group": "dp/4", "op": "all_reduce", "seq": 4, "since": TS - 5}
    for rank, inflight in ((1, recv), (2, coll)):
        reply = client.post(
            "/api/v1/ingest", json=batch([beat(inflight)], rank=rank), headers=INGEST
        )
        assert reply.status_code == 200, reply.text
    stored = {r.rank: r.inflight for r in session.scalars(select(Rank))}
    assert stored[1] == recv and stored[2] == coll
    job_id = session.scalar(select(Job.id))
    states = {s.rank: s for s in load_liveness(session=session, job_id=job_id, now=TS).states}
    got = states[1].inflight
    assert got is not None and got.peers == (5,) and got.p2p
    got = states[2].inflight
    assert got is not None and got.peers is None and not got.p2p


def test_a_receive_from_any_source_has_no_peers(client, session):  # type: ignore[no-untyped-def]
    anyone = {"group": "world", "op": "recv", "seq": 3, "since": TS - 5, "peers": []}
    reply = client.post("/api/v1/ingest", json=batch([beat(anyone)]), headers=INGEST)
    assert reply.status_code == 200, reply.text
    job_id = session.scalar(select(Job.id))
    (state,) = load_liveness(session=session, job_id=job_id, now=TS).states
    assert state.inflight is not None and state.inflight.peers == ()


@pytest.mark.parametrize("bad", [[-1], [True], ["x"], 3, [2_000_000]])
def test_bad_peers_are_named_and_nothing_stored(client, session, bad):  # type: ignore[no-untyped-def]
    inflight = {"group": "pp", "op": "send", "seq": 1, "since": TS, "peers": bad}
    reply = client.post("/api/v1/ingest", json=batch([beat(inflight)]), headers=INGEST)
    assert reply.status_code == 422, reply.text
    fields = [e["field"] for e in reply.json()["detail"]]
    assert any(f.startswith("events[0].inflight.peers") for f in fields), fields
    assert session.scalar(select(func.count()).select_from(Rank)) == 0

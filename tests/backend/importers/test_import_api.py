"""``POST /api/v1/jobs/{job}/imports/flight-recorder``: dumps decoded by the client (JSON of
plain values; the server never unpickles), checked as files are, diagnosed and stored as the
job's ``hang`` incident; bad input is a 422 naming the dump, with nothing stored."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from sqlalchemy import select

from backend.audit.models import AuditEntry
from backend.auth.service import create_token
from backend.importers.flight_recorder import upload_body
from backend.jobs.models import Job
from tests.conftest import ADMIN, INGEST

LOCK_GIL = Path(__file__).parents[2] / "data" / "flight_recorder" / "lock_gil_1st"
URL = "/api/v1/jobs/megatron-moe/imports/flight-recorder"


def _body() -> dict[str, Any]:
    return upload_body(LOCK_GIL)


def test_the_body_is_plain_json_without_what_the_diagnosis_does_not_read() -> None:
    body = _body()
    assert [d["rank"] for d in body["dumps"]] == list(range(16))
    assert body["dumps"][0]["source"] == "_dump_0"
    entry = body["dumps"][0]["dump"]["entries"][0]
    assert entry["profiling_name"] == "nccl:send 0->1" and "thread_id" not in entry


def test_imports_and_names_ranks_9_and_14(client, session) -> None:  # type: ignore[no-untyped-def]
    reply = client.post(URL, json=_body(), headers=INGEST)
    assert reply.status_code == 200, reply.text
    out = reply.json()
    assert out["culprits"] == [9, 14] and out["ranks"] == 16
    assert "Culprit ranks: 9, 14" in out["report"]
    assert out["incident_id"] is not None
    incidents = client.get("/api/v1/jobs/megatron-moe/incidents", headers=ADMIN).json()
    assert [(i["id"], i["kind"], i["ranks"]) for i in incidents] == [
        (out["incident_id"], "hang", [9, 14])
    ]
    # Imported again: the same incident.
    again = client.post(URL, json=_body(), headers=ADMIN)
    assert again.status_code == 200 and again.json()["incident_id"] == out["incident_id"]
    audit = session.scalars(select(AuditEntry).where(AuditEntry.event == "imported")).all()
    assert [a.actor for a in audit] == ["api:bootstrap", "api:bootstrap"]


def test_needs_the_ingest_scope(client, session) -> None:  # type: ignore[no-untyped-def]
    _, reader = create_token(session=session, name="viewer", scopes=["read"])
    session.commit()
    assert client.post(URL, json=_body()).status_code == 401
    refused = client.post(URL, json=_body(), headers={"Authorization": f"Bearer {reader}"})
    assert refused.status_code == 403 and "ingest" in refused.json()["detail"]
    assert session.scalar(select(Job).where(Job.name == "megatron-moe")) is None


def test_a_bad_dump_is_named_and_nothing_is_stored(client, session) -> None:  # type: ignore[no-untyped-def]
    body = _body()
    del body["dumps"][3]["dump"]["entries"]
    reply = client.post(URL, json=body, headers=INGEST)
    assert reply.status_code == 422, reply.text
    [error] = reply.json()["detail"]
    assert error["field"] == "dumps[3].dump" and "_dump_3" in error["msg"]
    assert "entries" in error["msg"]

    body = _body()
    body["dumps"][5]["rank"] = 4
    reply = client.post(URL, json=body, headers=INGEST)
    assert reply.status_code == 422
    [error] = reply.json()["detail"]
    assert error["field"] == "dumps[5].rank" and "rank 4 again" in error["msg"]

    body = _body()
    body["dumps"][2]["dump"]["entries"][0]["collective_seq_id"] = "many"
    reply = client.post(URL, json=body, headers=INGEST)
    assert reply.status_code == 422 and "collective_seq_id" in reply.text
    assert session.scalar(select(Job).where(Job.name == "megatron-moe")) is None


def test_takes_bodies_past_the_general_request_limit(client, settings) -> None:  # type: ignore[no-untyped-def]
    body = _body()
    # The ring buffers of a long job: far past 1 MiB (VIGIL_MAX_REQUEST_BYTES), under the
    # ingest limit (VIGIL_MAX_BODY_BYTES) that this route shares.
    done = copy.deepcopy(body["dumps"][0]["dump"]["entries"][0])
    done.update(state="completed", collective_seq_id=1, p2p_seq_id=1)
    for dump in body["dumps"]:
        dump["dump"]["entries"] += [done] * 400
    reply = client.post(URL, json=body, headers=INGEST)
    assert len(reply.request.content) > settings.max_request_bytes
    assert reply.status_code == 200, reply.text[:300]
    assert reply.json()["culprits"] == [9, 14]

    for dump in body["dumps"]:
        dump["dump"]["entries"] += [done] * 3000
    reply = client.post(URL, json=body, headers=INGEST)
    assert len(reply.request.content) > settings.max_body_bytes
    assert reply.status_code == 413

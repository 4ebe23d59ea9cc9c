"""``POST /api/v1/jobs/{job}/imports/kineto``: the per-iteration numbers the client read
from real traces, stored as the job's steps, collectives, op sequences and GPU breakdown
(through ingest), judged by the detectors; imported twice, stored once; bad input is a 422
naming the field, with nothing stored."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from backend.audit.models import AuditEntry
from backend.auth.service import create_token
from backend.importers.kineto_store import METRICS, OVERLAP_PCT
from backend.importers.kineto_upload import load_traces, request_bodies
from backend.jobs.models import Job
from backend.telemetry.models import CollectiveRecord, MetricPoint, OpSequence, StepRecord
from tests.conftest import ADMIN, INGEST
from tests.factories import batch

DATA = Path(__file__).parents[2] / "data" / "kineto"
URL = "/api/v1/jobs/{job}/imports/kineto"


def _body(*paths: Path) -> dict[str, Any]:
    [body] = request_bodies(load_traces(list(paths)))
    return body


def _count(session, model, job: str) -> int:  # type: ignore[no-untyped-def]
    job_id = session.scalar(select(Job.id).where(Job.name == job))
    return int(session.scalar(select(func.count()).where(model.job_id == job_id)) or 0)


def test_stores_the_real_trace_as_steps_collectives_and_op_sequences(client, session) -> None:  # type: ignore[no-untyped-def]
    reply = client.post(
        URL.format(job="pyper"), json=_body(DATA / "sampled_rank-0.json.gz"), headers=INGEST
    )
    assert reply.status_code == 200, reply.text
    out = reply.json()
    assert (out["ranks"], out["iterations"], out["duplicates"]) == ([0], 2, [])
    steps = client.get("/api/v1/jobs/pyper/steps", headers=ADMIN).json()["items"]
    assert [(s["step"], s["rank"]) for s in steps] == [(551, 0), (552, 0)]
    first = steps[0]
    assert first["duration_s"] == pytest.approx(0.607312)
    assert first["comm_s"] == pytest.approx(0.195327 - 0.023068)  # exposed communication
    assert first["opseq"] and first["opseq"] != steps[1]["opseq"]
    job = client.get("/api/v1/jobs/pyper", headers=ADMIN).json()
    assert job["world_size"] == 128
    [rank] = client.get("/api/v1/jobs/pyper/ranks", headers=ADMIN).json()
    assert rank["exited"] is True and rank["last_step"] == 552  # the traced run is over
    assert _count(session, CollectiveRecord, "pyper") == 6
    assert _count(session, OpSequence, "pyper") == 2
    idle = session.scalars(
        select(MetricPoint.value)
        .where(MetricPoint.name == METRICS["idle_s"])
        .order_by(MetricPoint.step)
    ).all()
    assert [round(v * 1e6) for v in idle] == [321378, 346625]  # HTA's idle time
    pct = session.scalars(select(MetricPoint.value).where(MetricPoint.name == OVERLAP_PCT)).all()
    assert [round(v, 2) for v in sorted(pct)] == [11.81, 18.0]
    audit = session.scalars(select(AuditEntry).where(AuditEntry.event == "imported")).all()
    assert [a.detail["what"] for a in audit] == ["kineto"]


def test_imported_twice_it_is_stored_once(client, session) -> None:  # type: ignore[no-untyped-def]
    body = _body(DATA / "gloo_ddp_2ranks")
    assert client.post(URL.format(job="ddp"), json=body, headers=INGEST).status_code == 200
    again = client.post(URL.format(job="ddp"), json=body, headers=ADMIN)
    assert again.status_code == 200 and again.json()["duplicates"] == [0, 1]
    assert _count(session, StepRecord, "ddp") == 6
    runs = client.get("/api/v1/jobs/ddp/runs", headers=ADMIN).json()
    assert len(runs) == 1  # a repeated import starts no empty run


def test_several_ranks_make_a_multi_rank_job(client, session) -> None:  # type: ignore[no-untyped-def]
    reply = client.post(URL.format(job="ddp"), json=_body(DATA / "gloo_ddp_2ranks"), headers=INGEST)
    assert reply.status_code == 200, reply.text
    assert reply.json()["ranks"] == [0, 1]
    job = client.get("/api/v1/jobs/ddp", headers=ADMIN).json()
    assert job["world_size"] == 2
    steps = client.get("/api/v1/jobs/ddp/steps", headers=ADMIN).json()["items"]
    assert sorted((s["step"], s["rank"]) for s in steps) == [
        (step, rank) for step in (2, 3, 4) for rank in (0, 1)
    ]
    assert len({s["opseq"] for s in steps}) == 1
    heatmap = client.get("/api/v1/jobs/ddp/heatmap", headers=ADMIN)
    assert heatmap.status_code == 200 and heatmap.json()["y"] == [0, 1]
    assert client.get("/jobs/ddp", headers=ADMIN).status_code == 200  # the job page


def test_the_detectors_name_the_real_straggler_of_an_imported_job(client) -> None:  # type: ignore[no-untyped-def]
    # Rank 2 of this 4-rank gloo job slept 1 s in its forward pass from step 6 on.
    reply = client.post(
        URL.format(job="ddp4"), json=_body(DATA / "gloo_ddp_4ranks_straggler"), headers=INGEST
    )
    assert reply.status_code == 200, reply.text
    assert [(i["kind"], i["ranks"]) for i in reply.json()["incidents"]] == [("straggler", [2])]
    [incident] = client.get("/api/v1/jobs/ddp4/incidents", headers=ADMIN).json()
    assert incident["ranks"] == [2] and incident["first_step"] <= 6


def test_needs_the_ingest_scope(client, session) -> None:  # type: ignore[no-untyped-def]
    _, reader = create_token(session=session, name="viewer", scopes=["read"])
    session.commit()
    body = _body(DATA / "gloo_ddp_2ranks")
    assert client.post(URL.format(job="ddp"), json=body).status_code == 401
    refused = client.post(
        URL.format(job="ddp"), json=body, headers={"Authorization": f"Bearer {reader}"}
    )
    assert refused.status_code == 403 and "ingest" in refused.json()["detail"]
    assert session.scalar(select(Job).where(Job.name == "ddp")) is None


def test_a_serving_job_still_reporting_is_refused(client, session) -> None:  # type: ignore[no-untyped-def]
    now = time.time()
    served = {"type": "request", "id": "r-1", "arrival": now - 1, "end": now, "status": "ok"}
    body = batch([served], job="chat", kind="serving", world_size=1)
    assert client.post("/api/v1/ingest", json=body, headers=INGEST).status_code == 200
    reply = client.post(
        URL.format(job="chat"), json=_body(DATA / "gloo_ddp_2ranks"), headers=INGEST
    )
    assert reply.status_code == 409, reply.text
    assert _count(session, StepRecord, "chat") == 0


def _broken(change) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    body = copy.deepcopy(_body(DATA / "gloo_ddp_2ranks"))
    change(body)
    return body


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        (lambda b: b["ranks"][1].update(rank=0), "ranks[1].rank", "rank 0 again"),
        (lambda b: b["ranks"][1].update(rank=2), "ranks[1].rank", "outside world_size 2"),
        (
            lambda b: b["ranks"][0]["iterations"].append(b["ranks"][0]["iterations"][0]),
            "ranks[0].iterations[3].step",
            "step 2 again",
        ),
        (lambda b: b["ranks"][1]["iterations"][2].update(ts=-1), "ranks[1].iterations[2].ts", ""),
        (lambda b: b["ranks"][0]["collectives"][0].pop("op"), "ranks[0].collectives[0].op", ""),
        (lambda b: b["ranks"][0].update(iterations=[]), "ranks[0].iterations", ""),
        (
            lambda b: b["ranks"][0]["iterations"][0].update(duration_s=True),
            "ranks[0].iterations[0].duration_s",
            "not a boolean",
        ),
    ],
)
def test_a_bad_body_is_named_and_nothing_is_stored(client, session, change, field, says) -> None:  # type: ignore[no-untyped-def]
    reply = client.post(URL.format(job="ddp"), json=_broken(change), headers=INGEST)
    assert reply.status_code == 422, reply.text
    [error] = reply.json()["detail"]
    assert error["field"] == field and says in error["msg"]
    assert session.scalar(select(Job).where(Job.name == "ddp")) is None

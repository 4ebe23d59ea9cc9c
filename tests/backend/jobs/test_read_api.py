"""Read API: jobs, one job, steps (filters, pagination), ranks; all need a read token."""

from __future__ import annotations

import time

import pytest

from backend.auth.service import create_token
from tests.conftest import ADMIN, INGEST
from tests.factories import batch, step


@pytest.fixture
def job(client):  # type: ignore[no-untyped-def]
    """A 4-rank job with 30 steps per rank; rank 2 is slow."""
    now = time.time()
    for rank in range(4):
        events = [step(n, ts=now - 30 + n, duration_s=0.5 if rank == 2 else 0.3) for n in range(30)]
        events.append({"type": "heartbeat", "ts": now - 1, "step": 30})
        reply = client.post(
            "/api/v1/ingest", json=batch(events, rank=rank, host=f"node-{rank}"), headers=INGEST
        )
        assert reply.status_code == 200
    return "llama-8b-pretrain"


def test_list_jobs(client, job):
    jobs = client.get("/api/v1/jobs", headers=ADMIN).json()
    assert [j["name"] for j in jobs] == [job]
    assert jobs[0]["ranks_reporting"] == 4
    assert jobs[0]["last_step"] == 29
    assert jobs[0]["last_seen_at"].endswith("+00:00") or jobs[0]["last_seen_at"].endswith("Z")


def test_one_job(client, job):
    detail = client.get(f"/api/v1/jobs/{job}", headers=ADMIN).json()
    assert detail["steps_stored"] == 120
    assert detail["world_size"] == 4
    assert detail["step_time_median_s"] == pytest.approx(0.3)
    assert detail["open_incidents"] == 0


def test_unknown_job_is_404_naming_it(client):
    reply = client.get("/api/v1/jobs/nope", headers=ADMIN)
    assert reply.status_code == 404
    assert "'nope'" in reply.json()["detail"]
    assert client.get("/api/v1/jobs/nope/steps", headers=ADMIN).status_code == 404


def test_steps_filtered_by_rank_and_range(client, job):
    page = client.get(
        f"/api/v1/jobs/{job}/steps",
        params={"rank": 2, "from_step": 10, "to_step": 14},
        headers=ADMIN,
    ).json()
    assert [(s["rank"], s["step"]) for s in page["items"]] == [(2, n) for n in range(10, 15)]
    assert all(s["duration_s"] == 0.5 for s in page["items"])
    assert page["next_cursor"] is None


def test_steps_pagination_visits_every_row_once_in_order(client, job):
    seen, cursor = [], None
    while True:
        params = {"limit": 7, **({"cursor": cursor} if cursor else {})}
        page = client.get(f"/api/v1/jobs/{job}/steps", params=params, headers=ADMIN).json()
        seen += [(s["step"], s["rank"]) for s in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted((n, r) for n in range(30) for r in range(4))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"cursor": "garbage"}, "cursor"),
        ({"from_step": 10, "to_step": 5}, "from_step"),
        ({"limit": 0}, "limit"),
        ({"rank": -1}, "rank"),
    ],
)
def test_bad_query_parameters_are_422(client, job, params, message):
    reply = client.get(f"/api/v1/jobs/{job}/steps", params=params, headers=ADMIN)
    assert reply.status_code == 422
    assert message in reply.text


def test_ranks_with_latest_state(client, job):
    ranks = client.get(f"/api/v1/jobs/{job}/ranks", headers=ADMIN).json()
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert {r["host"] for r in ranks} == {"node-0", "node-1", "node-2", "node-3"}
    assert all(r["last_step"] == 29 and r["current_step"] == 30 for r in ranks)
    assert all(0 <= r["heartbeat_age_s"] < 60 for r in ranks)


def test_read_endpoints_need_a_read_token(client, job, session):
    paths = [
        "/api/v1/jobs",
        f"/api/v1/jobs/{job}",
        f"/api/v1/jobs/{job}/steps",
        f"/api/v1/jobs/{job}/ranks",
    ]
    _, reader = create_token(session=session, name="grafana", scopes=["read"])
    session.commit()
    for path in paths:
        assert client.get(path).status_code == 401
        assert client.get(path, headers=INGEST).status_code == 403
        assert client.get(path, headers={"Authorization": f"Bearer {reader}"}).status_code == 200


def test_healthz_and_openapi(client):
    health = client.get("/healthz").json()
    assert health["status"] == "ok" and health["database"] == "ok"
    assert health["mode"] == "embedded"
    spec = client.get("/openapi.json").json()
    body = spec["paths"]["/api/v1/ingest"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"]["$ref"].endswith("/IngestBatch")
    assert "StepEvent" in spec["components"]["schemas"]
    assert client.get("/docs").status_code == 200


def test_metrics_count_ingest_outcomes(client, job):
    text = client.get("/metrics").text
    assert 'vigil_ingest_batches_total{outcome="stored"}' in text
    assert 'vigil_ingest_events_total{type="step"}' in text

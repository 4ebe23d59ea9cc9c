"""``GET /metrics`` for Prometheus: serving histograms with vLLM's bucket edges under
``vigil_`` names, SLO gauges, training gauges; bounded label sets."""

from __future__ import annotations

import time
import uuid

from prometheus_client.parser import text_string_to_metric_families

from backend.telemetry import prometheus
from tests.conftest import ADMIN, INGEST
from tests.factories import batch, step


def scrape(client) -> dict[str, list]:  # type: ignore[no-untyped-def, type-arg]
    text = client.get("/metrics").text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_serving_histograms_and_slo_gauges(client):
    job, now = f"chat-{uuid.uuid4().hex[:6]}", time.time()
    client.post("/api/v1/slos", json={"job": job, "name": "fast", "ttft_s": 0.5}, headers=ADMIN)
    events = [
        {
            "type": "request",
            "id": f"r{i}",
            "arrival": now - 60 + i,
            "first_token": now - 60 + i + (0.2 if i % 4 else 0.9),
            "end": now - 60 + i + 2.0,
            "output_tokens": 11,
            "model": "tiny",
            "replica": "r0",
        }
        for i in range(40)
    ]
    reply = client.post(
        "/api/v1/ingest", json=batch(events, job=job, kind="serving"), headers=INGEST
    )
    assert reply.status_code == 200
    metrics = scrape(client)
    ttft = [
        s
        for s in metrics["vigil_time_to_first_token_seconds"]
        if s.labels.get("job") == job and s.name.endswith("_bucket")
    ]
    assert {s.labels["le"] for s in ttft} >= {"0.25", "1.0", "2560.0", "+Inf"}  # vLLM's edges
    le = {s.labels["le"]: s.value for s in ttft}
    assert (le["0.25"], le["1.0"], le["+Inf"]) == (30.0, 40.0, 40.0)
    assert ttft[0].labels["model"] == "tiny" and ttft[0].labels["replica"] == "r0"
    [attainment] = [s for s in metrics["vigil_slo_attainment"] if s.labels["job"] == job]
    assert attainment.labels["slo"] == "fast" and abs(attainment.value - 0.75) < 1e-9
    burn = [s for s in metrics["vigil_slo_burn_rate"] if s.labels["job"] == job]
    assert {s.labels["window"] for s in burn} >= {"3360s", "300s"}  # 56 and 5 min (28 d)


def test_training_gauges(client):
    job = f"train-{uuid.uuid4().hex[:6]}"
    client.post(
        "/api/v1/ingest",
        json=batch([step(n, duration_s=0.25) for n in range(10)], job=job),
        headers=INGEST,
    )
    metrics = scrape(client)
    [gauge] = [s for s in metrics["vigil_job_step_time_seconds"] if s.labels["job"] == job]
    assert gauge.value == 0.25
    [goodput] = [s for s in metrics["vigil_training_goodput"] if s.labels["job"] == job]
    assert 0.0 < goodput.value <= 1.0
    heartbeat = {"type": "heartbeat", "ts": time.time() - 5.0, "step": 10}
    client.post("/api/v1/ingest", json=batch([heartbeat], job=job), headers=INGEST)
    ages = scrape(client)["vigil_job_last_heartbeat_age_seconds"]
    [age] = [s for s in ages if s.labels["job"] == job]
    assert 4.0 <= age.value < 60.0


def test_label_sets_are_bounded(monkeypatch):
    monkeypatch.setattr(prometheus, "MAX_SERIES", 2)
    monkeypatch.setattr(prometheus, "_series", set())
    seen = [prometheus._labels("j", {"replica": f"r{i}"}) for i in range(5)]
    assert [s[2] for s in seen] == ["r0", "r1", "other", "other", "other"]


def test_job_gauges_name_the_run(client, session):
    """A job name launched again is a new run: the per-job gauges carry ``run`` (its number)
    and describe that run, not a mix of both launches."""
    from sqlalchemy import select

    from backend.incidents.models import Incident
    from backend.jobs.models import Job

    job, now = f"relaunched-{uuid.uuid4().hex[:6]}", time.time()
    first = [step(n, ts=now - 100 + n, duration_s=0.25) for n in range(20)]
    goodbye = {"type": "heartbeat", "ts": now - 80, "exiting": True, "exit_code": 0}
    for events in (first, [goodbye]):
        body = batch(events, job=job, world_size=1, run="launch-a")
        assert client.post("/api/v1/ingest", json=body, headers=INGEST).status_code == 200
    second = [step(n, ts=now - 10 + n, duration_s=0.5) for n in range(5)]
    beat = {"type": "heartbeat", "ts": now - 3.0, "step": 5}
    body = batch([*second, beat], job=job, world_size=1, run="launch-b")
    assert client.post("/api/v1/ingest", json=body, headers=INGEST).status_code == 200
    job_id = session.scalar(select(Job.id).where(Job.name == job))
    fp = f"{job_id}@2:straggler:0"  # opened in run 2 (backend.incidents.service.fingerprint)
    session.add(Incident(job_id=job_id, kind="straggler", fingerprint=fp, ranks=[0], score=4.5))
    session.commit()

    metrics = scrape(client)

    def mine(name: str) -> list:  # type: ignore[type-arg]
        return [s for s in metrics[name] if s.labels["job"] == job]

    [step_time] = mine("vigil_job_step_time_seconds")
    assert (step_time.labels["run"], step_time.value) == ("2", 0.5)  # run 2's steps only
    [goodput] = mine("vigil_training_goodput")
    assert goodput.labels["run"] == "2" and 0.0 < goodput.value <= 1.0
    [age] = mine("vigil_job_last_heartbeat_age_seconds")
    assert age.labels["run"] == "2" and 2.0 <= age.value < 60.0
    [open_] = mine("vigil_open_incidents")
    assert (open_.labels["run"], open_.labels["kind"], open_.value) == ("2", "straggler", 1)
    [score] = mine("vigil_straggler_score")
    assert (score.labels["run"], score.labels["rank"], score.value) == ("2", "0", 4.5)

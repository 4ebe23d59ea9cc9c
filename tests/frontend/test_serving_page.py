"""The serving page renders from ingested requests: its SLOs with their figures, a headline
saying whether they are met now, the job's incidents linked, every chart's container;
user text escaped; the jobs list and the job page link it. A failing SLO status is shown,
not raised."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

from fastapi.testclient import TestClient

from backend.api import create_app
from backend.db import utcnow
from backend.incidents.models import Incident
from backend.settings import Settings
from backend.slos import service as slo_service
from tests.backend.telemetry.test_serving_queries import ingest_requests, synthetic_requests
from tests.conftest import ADMIN
from tests.frontend.helpers import ingest_job, job_id

JOB = "chat-prod"
SCRIPT = "<script>alert(1)</script>"
SVG = "<svg onload=alert(1)>"
IMG = '<img src=x onerror="alert(1)">'
PAYLOADS = (SCRIPT, SVG, IMG, "<script>")
CHART_IDS = (
    "ttft-chart",
    "tpot-chart",
    "e2e-chart",
    "traffic-chart",
    "attainment-chart",
    "goodput-chart",
    "budget-chart",
    "burn-chart",
    "replica-bars",
    "replica-ttft-chart",
)


def serving_job(client: Any, job: str = JOB, slo: str = "interactive", **kw: Any) -> None:
    """An SLO, then the last 15 minutes of a 3-replica job whose ``r2`` is 3× slower."""
    body = {"job": job, "name": slo, "ttft_s": 0.5, "tpot_s": 0.05, "objective": 0.95}
    assert client.post("/api/v1/slos", json=body, headers=ADMIN).status_code == 201
    t0 = (time.time() // 60 - 15) * 60
    ingest_requests(client, synthetic_requests(t0=t0, minutes=15, slow={"r2": 3.0}, **kw), job=job)


def incident(session: Any, job: str, kind: str = "slo_burn", summary: str = "") -> Incident:
    jid = job_id(session, job)
    row = Incident(
        job_id=jid,
        kind=kind,
        severity="critical",
        status="open",
        fingerprint=f"{jid}:{kind}",
        ranks=[],
        summary=summary or f"{kind} on {job}",
        evidence={},
        detected_at=utcnow(),
        updated_at=utcnow(),
    )
    session.add(row)
    session.commit()
    return row


def test_serving_page_lists_slos_headline_incidents_and_charts(client, session):
    serving_job(client)
    burn = incident(session, JOB, summary="interactive burns 20x its budget")
    page = client.get(f"/jobs/{JOB}/serving")
    assert page.status_code == 200
    html = page.text
    assert 'id="slos-table"' in html and 'data-slo="interactive"' in html
    assert "TTFT ≤ 500 ms" in html and "TPOT ≤ 50 ms" in html
    assert 'class="headline level-critical"' in html  # r2 makes the SLO burn
    assert "SLO violated now: interactive" in html
    assert f'href="/incidents/{burn.id}"' in html and "interactive burns 20x" in html
    for chart in CHART_IDS:
        assert f'id="{chart}"' in html
    assert f"/api/v1/jobs/{JOB}/serving/status" in html  # page data for the script
    assert 'src="/static/serving.js"' in html
    assert "Content-Security-Policy" in page.headers


def test_a_job_without_slos_says_so(client):
    t0 = (time.time() // 60 - 5) * 60
    ingest_requests(client, synthetic_requests(t0=t0, minutes=5), job="bare")
    html = client.get("/jobs/bare/serving").text
    assert 'class="headline level-none"' in html and "No SLOs defined" in html
    assert "POST /api/v1/slos" in html
    status = client.get("/api/v1/jobs/bare/serving/status", headers=ADMIN).json()
    assert status["headline"]["level"] == "none" and status["slos"] == []


def test_unknown_job_is_a_404_page(client):
    page = client.get("/jobs/nope/serving")
    assert page.status_code == 404 and "No job named" in page.text


def test_jobs_list_and_job_page_link_the_serving_page(client, session):
    serving_job(client)
    ingest_job(client, "train", ranks=2, steps=range(10), slow_rank=None)
    html = client.get("/").text
    assert f'href="/jobs/{JOB}/serving" class="serving-link"' in html
    assert 'class="slo-health level-critical"' in html and "SLO violated" in html
    assert 'href="/jobs/train/serving"' not in html  # a training job has no serving link
    row = html[html.index(f'data-name="{JOB}"') :]
    assert 'data-health="3"' in row[: row.index("</tr>")] or "health-critical" in row[:400]
    job_page = client.get(f"/jobs/{JOB}").text
    assert 'id="serving-link"' in job_page and f'href="/jobs/{JOB}/serving"' in job_page
    assert 'id="serving-link"' not in client.get("/jobs/train").text


def test_names_are_escaped(client, session):
    serving_job(client, job=SVG, slo=SCRIPT, model=IMG)
    incident(session, SVG, summary=f"replica {IMG} is slow {SCRIPT}")
    pages = [f"/jobs/{quote(SVG, safe='')}/serving", "/"]
    for url in pages:
        reply = client.get(url)
        assert reply.status_code == 200, url
        for payload in PAYLOADS:
            assert payload not in reply.text, (url, payload)
    html = client.get(pages[0]).text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # the SLO's name, as text
    assert "&lt;svg onload=alert(1)&gt;" in html  # the job's
    status = client.get(f"/api/v1/jobs/{quote(SVG, safe='')}/serving/status", headers=ADMIN)
    assert status.json()["slos"][0]["name"] == SCRIPT  # JSON keeps it; the script escapes it


def test_a_failing_slo_status_is_shown_not_raised(client, monkeypatch):
    serving_job(client)

    def broken(**_: Any) -> dict[str, Any]:
        raise RuntimeError("burn-rate windows unavailable")

    monkeypatch.setattr(slo_service, "status", broken)
    page = client.get(f"/jobs/{JOB}/serving")
    assert page.status_code == 200
    assert "status unavailable (RuntimeError)" in page.text
    assert 'class="headline level-unknown"' in page.text
    jobs = client.get("/")
    assert jobs.status_code == 200 and "status unavailable" in jobs.text
    status = client.get(f"/api/v1/jobs/{JOB}/serving/status", headers=ADMIN)
    assert status.status_code == 200 and status.json()["slos"][0]["attainment"] is None


def test_production_needs_a_sign_in(settings, engine, session_factory):
    token = "prod-admin-token-serving-0123"
    prod = Settings(
        database_url=settings.database_url,
        env="production",
        admin_token=token,
        token_cache_s=0,
        detect_interval_s=0,
    )
    app = create_app(prod, engine=engine, session_factory=session_factory)
    with TestClient(app) as client:
        page = client.get("/jobs/x/serving", follow_redirects=False)
        assert page.status_code == 303 and page.headers["location"].startswith("/login")
        for url in ("/api/v1/jobs/x/serving", "/api/v1/jobs/x/serving/status"):
            assert client.get(url).status_code == 401
            signed = client.get(url, headers={"Authorization": f"Bearer {token}"})
            assert signed.status_code == 404  # signed in: no such job

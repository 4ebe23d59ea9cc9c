"""Every page renders with real ingested data; the chart endpoints answer in shape."""

from __future__ import annotations

import gzip

from tests.conftest import ADMIN

CHART_IDS = (
    "step-time-chart",
    "heatmap",
    "bandwidth-chart",
    "memory-chart",
    "loss-chart",
    "goodput-chart",
)


def test_jobs_page_shows_health_at_a_glance(client, straggler):
    page = client.get("/")
    assert page.status_code == 200
    html = page.text
    assert 'id="jobs-table"' in html and 'data-name="llama-8b-pretrain"' in html
    assert 'data-warning="1"' in html  # the open straggler incident
    assert 'data-step="119"' in html
    assert "0.400 s" in html  # median recent step time
    for nav in ("/alerts", "/settings", "/docs"):
        assert f'href="{nav}"' in html
    assert "Content-Security-Policy" in page.headers and page.headers["X-Frame-Options"] == "DENY"


def test_job_page_has_every_chart_and_the_live_counter(client, straggler):
    page = client.get("/jobs/llama-8b-pretrain")
    assert page.status_code == 200
    html = page.text
    for chart in CHART_IDS:
        assert f'id="{chart}"' in html
    assert '<span id="current-step" class="big">119</span>' in html
    assert 'id="page-data"' in html and "/ui/jobs/llama-8b-pretrain/stream" in html
    assert f'data-action="approve" data-id="{straggler["action"].id}"' in html
    assert 'data-rank="2"' in html  # ranks table


def test_incident_page_shows_evidence_and_actions(client, straggler):
    incident = straggler["incident"]
    page = client.get(f"/incidents/{incident.id}")
    assert page.status_code == 200
    html = page.text
    assert 'id="evidence-chart"' in html and 'id="evidence-table"' in html
    assert "ratio" in html  # a detector number, as a key/value row
    assert 'data-action="approve"' in html and 'data-action="cancel"' in html
    assert 'data-action="trigger"' in html
    assert "est. cost (s)" in html and "do nothing" in html  # the cost table
    assert incident.summary in html


def test_alerts_and_settings_pages(client, straggler):
    alerts = client.get("/alerts")
    assert alerts.status_code == 200
    assert f'href="/incidents/{straggler["incident"].id}"' in alerts.text
    settings = client.get("/settings")
    assert settings.status_code == 200
    assert 'id="receivers"' in settings.text and 'id="policies"' in settings.text
    assert 'id="tokens"' in settings.text  # the dev admin sees tokens


def test_unknown_things_are_404_pages(client):
    for url in ("/jobs/nope", "/incidents/999999"):
        page = client.get(url)
        assert page.status_code == 404 and "text/html" in page.headers["content-type"]


def test_chart_endpoints(client, straggler):
    base = "/api/v1/jobs/llama-8b-pretrain"
    series = client.get(f"{base}/series").json()
    assert series["step"][:3] == [0, 1, 2] and series["step_time"][0] == 0.4
    assert series["loss"][0] == 2.0 and series["memory"]["max_bytes"][0] == 1_000_003
    assert [i["kind"] for i in series["incidents"]] == ["straggler"]
    bandwidth = client.get(f"{base}/bandwidth?max_steps=12").json()
    [dp] = bandwidth["groups"]
    assert dp["group"] == "dp" and dp["step"][:3] == [0, 10, 20] and len(dp["step"]) == 12
    assert dp["bytes_per_s"][0] == 1e8  # 1 MB in 0.01 s, whatever the bin
    overview = client.get(f"{base}/overview").json()
    assert overview["job"]["last_step"] == 119 and 0 < overview["goodput"]["goodput"] <= 1
    evidence = client.get(f"/api/v1/incidents/{straggler['incident'].id}/evidence-chart").json()
    [rank] = evidence["ranks"]
    assert rank["rank"] == 2
    late = evidence["step"].index(100)
    assert rank["compute_s"][late] > 1.3 * evidence["median"][late]
    assert client.get(f"{base}/heatmap", headers=ADMIN).status_code == 200
    assert client.get("/api/v1/jobs/nope/series").status_code == 404


def test_plotly_is_served_from_the_installed_package(client):
    plain = client.get("/static/plotly.min.js", headers={"Accept-Encoding": "identity"})
    assert plain.status_code == 200 and plain.headers["content-type"].startswith("text/javascript")
    assert b"plotly" in plain.content[:2000].lower() and len(plain.content) > 1_000_000
    raw = client.get("/static/plotly.min.js", headers={"Accept-Encoding": "gzip"})
    assert raw.content == plain.content  # httpx decodes the gzip body
    etag = plain.headers["etag"]
    again = client.get("/static/plotly.min.js", headers={"If-None-Match": etag})
    assert again.status_code == 304
    assert gzip.decompress(gzip.compress(b"x")) == b"x"
    for asset in ("vigil.js", "job.js", "jobs.js", "incident.js", "vigil.css"):
        assert client.get(f"/static/{asset}").status_code == 200

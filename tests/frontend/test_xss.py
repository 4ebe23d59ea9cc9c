"""User text (job names, summaries, evidence, event attributes, receiver and token names)
reaches every page escaped, never as markup."""

from __future__ import annotations

from urllib.parse import quote

from backend.actions.service import create_action
from backend.alerts.service import create_receiver
from backend.auth.service import create_token
from backend.db import utcnow
from backend.incidents.models import Incident
from backend.jobs.models import Job
from backend.recovery.policies import put_policy
from tests.frontend.helpers import ingest_job, job_id

SCRIPT = "<script>alert(1)</script>"
SVG = "<svg onload=alert(1)>"  # ingest refuses '/' in job names
IMG = '<img src=x onerror="alert(1)">'
PAYLOADS = (SCRIPT, SVG, IMG, "<b>", "<script>")


def test_user_text_is_escaped_on_every_page(client, session):
    attrs = {"path": IMG, "note": SCRIPT}
    event = {"type": "event", "name": "checkpoint_saved", "step": 5, "attrs": attrs}
    ingest_job(client, SVG, ranks=2, steps=range(20), slow_rank=None, extra=[event])
    svg_job = job_id(session, SVG)
    script_job = Job(name=SCRIPT, world_size=1)
    session.add(script_job)
    session.flush()
    incident = Incident(
        job_id=svg_job,
        kind="straggler",
        severity="critical",
        status="open",
        fingerprint=f"{svg_job}:xss",
        ranks=[1],
        first_step=10,
        summary=f"rank 1 {IMG} {SCRIPT}",
        evidence={"<b>key</b>": SCRIPT, "nested": {"x": IMG}},
        detected_at=utcnow(),
        updated_at=utcnow(),
    )
    session.add(incident)
    session.flush()
    create_action(
        session=session,
        job_id=svg_job,
        kind="restart",
        requested_by=f"api:{SCRIPT}",
        reason=f"because {IMG}",
        incident_id=incident.id,
        state="proposed",
        reasoning={
            "explanation": SCRIPT,
            "candidates": [{"action": "restart", "cost_s": 1.0, "explanation": IMG}],
        },
    )
    create_receiver(session=session, name=SCRIPT, url="http://127.0.0.1:9/<script>")
    create_token(session=session, name=IMG, scopes=["read"])
    put_policy(session=session, job=SCRIPT, kind="hang", mode="auto", actor=SCRIPT)
    session.commit()

    pages = [
        "/",
        f"/jobs/{quote(SVG, safe='')}",
        f"/incidents/{incident.id}",
        "/alerts",
        "/settings",
        f"/login?next={quote(SCRIPT)}",
    ]
    for url in pages:
        reply = client.get(url)
        assert reply.status_code == 200, url
        html = reply.text
        for payload in PAYLOADS:
            assert payload not in html, (url, payload)
        assert "onerror=" not in html.replace("onerror=&#34;", "").replace("onerror=&quot;", "")
    everywhere = "".join(client.get(u).text for u in pages)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in everywhere
    assert "&lt;svg onload=alert(1)&gt;" in everywhere
    incident_html = client.get(f"/incidents/{incident.id}").text
    assert "&lt;b&gt;key&lt;/b&gt;" in incident_html  # the evidence key, as text
    job_html = client.get(f"/jobs/{quote(SVG, safe='')}").text
    assert "\\u003csvg onload=alert(1)\\u003e" in job_html  # page data: JSON, escaped


def test_error_pages_escape_what_they_echo(client):
    reply = client.get(f"/jobs/{quote(SVG, safe='')}")
    assert reply.status_code == 404
    assert SVG not in reply.text and "&lt;svg onload=alert(1)&gt;" in reply.text

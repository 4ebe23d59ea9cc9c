"""Handling alerts from the pages: acknowledge, silence, resolve by hand and "send open
incidents" through CSRF-checked forms (admins only), and what the incident and alerts
pages show of it (open for, acknowledged by, silenced)."""

from __future__ import annotations

from sqlalchemy import select

from backend.alerts.models import Silence, WebhookDelivery
from backend.alerts.service import create_receiver
from backend.audit.models import AuditEntry
from backend.auth.service import create_token
from backend.incidents.models import Incident
from tests.frontend.helpers import JOB, csrf_of


def test_incident_page_acknowledge_and_take_it_back(client, session, straggler):
    incident = straggler["incident"]
    url = f"/incidents/{incident.id}"
    page = client.get(url).text
    assert 'id="handling"' in page and 'id="open-for"' in page and 'id="ack-button"' in page
    csrf = csrf_of(page)
    done = client.post(f"/ui/incidents/{incident.id}/ack", data={"csrf_token": csrf, "next": url})
    assert done.status_code == 200 and "Incident acknowledged" in done.text
    assert "acknowledged</span> by ui:dev-admin" in done.text and 'id="unack-button"' in done.text
    session.expire_all()
    assert session.get(Incident, incident.id).acked_by == "ui:dev-admin"
    back = client.post(f"/ui/incidents/{incident.id}/unack", data={"csrf_token": csrf})
    assert back.status_code == 200 and 'id="ack-button"' in back.text


def test_incident_page_silence_shows_it_silenced(client, session, straggler):
    incident = straggler["incident"]
    url = f"/incidents/{incident.id}"
    csrf = csrf_of(client.get(url).text)
    form = {
        "csrf_token": csrf,
        "next": url,
        "job": JOB,
        "kind": "straggler",
        "rank": "2",
        "duration_s": "7200",
        "comment": "node 7 drained <script>alert(1)</script>",
    }
    done = client.post("/ui/silences", data=form)
    assert done.status_code == 200 and "Silence created" in done.text
    [row] = session.scalars(select(Silence))
    assert row.matchers == {"job": JOB, "kind": "straggler", "rank": 2}
    assert row.created_by == "ui:dev-admin"
    assert f"by silence #{row.id}" in done.text and "node 7 drained" in done.text
    assert "<script>alert(1)" not in done.text and "&lt;script&gt;" in done.text
    alerts = client.get("/alerts").text
    assert "silenced (#" in alerts and 'id="silences"' in alerts
    expired = client.post(f"/ui/silences/{row.id}/expire", data={"csrf_token": csrf})
    assert expired.status_code == 200 and "Silence expired" in expired.text
    assert "No silences in force" in expired.text


def test_bad_silence_forms_are_422_pages_and_store_nothing(client, session, straggler):
    csrf = csrf_of(client.get("/alerts").text)
    for form, words in (
        ({"duration_s": "7200"}, "at least one"),
        ({"kind": "straggler", "duration_s": "12"}, "Duration"),
        ({"kind": "straggler", "rank": "two", "duration_s": "7200"}, "Rank"),
        ({"kind": "boom", "duration_s": "7200"}, "matchers.kind"),
    ):
        reply = client.post("/ui/silences", data={"csrf_token": csrf, **form})
        assert reply.status_code == 422 and words in reply.text, (form, reply.text[:300])
    assert list(session.scalars(select(Silence))) == []


def test_resolve_by_hand_from_the_page(client, session, straggler):
    incident = straggler["incident"]
    url = f"/incidents/{incident.id}"
    csrf = csrf_of(client.get(url).text)
    empty = client.post(f"/ui/incidents/{incident.id}/resolve", data={"csrf_token": csrf})
    assert empty.status_code == 422 and "note" in empty.text
    done = client.post(
        f"/ui/incidents/{incident.id}/resolve",
        data={"csrf_token": csrf, "note": "replaced the GPU", "next": url},
    )
    assert done.status_code == 200 and "Incident resolved" in done.text
    assert "ui:dev-admin: replaced the GPU" in done.text and "was open for" in done.text
    session.expire_all()
    row = session.get(Incident, incident.id)
    assert (row.status, row.resolved_by) == ("resolved", "ui:dev-admin")
    audit = session.scalars(select(AuditEntry).where(AuditEntry.event == "resolved")).all()
    assert [a.detail for a in audit] == [{"note": "replaced the GPU"}]


def test_alerts_page_shows_open_for_and_sends_open_incidents(client, session, straggler):
    rx = create_receiver(session=session, name="oncall", url="http://127.0.0.1:9/hook")
    session.commit()
    page = client.get("/alerts").text
    assert 'class="open-for"' in page and 'data-action="send-open"' in page
    sent = client.post(f"/ui/webhooks/{rx.id}/send-open", data={"csrf_token": csrf_of(page)})
    assert sent.status_code == 200 and "were sent to the receiver" in sent.text
    rows = session.scalars(select(WebhookDelivery).where(WebhookDelivery.receiver_id == rx.id))
    assert [d.incident_id for d in rows] == [straggler["incident"].id]


def test_handling_needs_admin_and_a_csrf_token(client, session, straggler):
    incident = straggler["incident"]
    page = client.get(f"/incidents/{incident.id}").text
    no_csrf = client.post(f"/ui/incidents/{incident.id}/ack", data={})
    assert no_csrf.status_code == 403
    _, read = create_token(session=session, name="viewer", scopes=["read"])
    session.commit()
    reader = {"Authorization": f"Bearer {read}"}
    as_reader = client.get(f"/incidents/{incident.id}", headers=reader).text
    assert 'id="handling"' in as_reader and 'id="ack-button"' not in as_reader
    refused = client.post(
        f"/ui/incidents/{incident.id}/ack", data={"csrf_token": csrf_of(page)}, headers=reader
    )
    assert refused.status_code == 403
    session.expire_all()
    assert session.get(Incident, incident.id).acked_at is None

"""One fault, one incident: a job-wide slowdown that a named straggler, hang or slow link
explains is linked to it (one notification, no second action), and an episode seen again
with the same onset is the same incident (issue 17)."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from backend.actions.models import Action
from backend.alerts.models import WebhookDelivery
from backend.incidents.follow_up import follow_up
from backend.incidents.models import Incident
from backend.incidents.service import apply_findings
from detectors.finding import Finding
from tests.conftest import ADMIN, INGEST
from tests.factories import batch, step

JOB = "llama-8b-pretrain"
WINDOW_KINDS = {"straggler", "slowdown", "comm_anomaly"}


def straggler(rank: int = 2, first: int = 60) -> Finding:
    return Finding(
        kind="straggler",
        severity="critical",
        ranks=(rank,),
        first_step=first,
        score=9.0,
        summary=f"rank {rank} computes 1.6x slower than the median rank since step {first}",
        key=f"straggler:{rank}",
        evidence={"ratio": 1.6},
    )


def slowdown(first: int = 62, *, component: str = "compute") -> Finding:
    return Finding(
        kind="slowdown",
        severity="warning",
        ranks=(),
        first_step=first,
        score=0.4,
        summary=f"step time rose 40% at step {first}, mostly {component}",
        key="slowdown",
        evidence={"onset_step": first, "component": component},
    )


@pytest.fixture
def job_id(client, session):  # type: ignore[no-untyped-def]
    client.post("/api/v1/ingest", json=batch([step(1)]), headers=INGEST)
    made = client.post(
        "/api/v1/webhooks", json={"name": "oncall", "url": "http://127.0.0.1:9/hook"}, headers=ADMIN
    )
    assert made.status_code in (200, 201), made.text
    from backend.jobs.models import Job

    return session.scalar(select(Job.id).where(Job.name == JOB))


def run(session, settings, job_id, findings):  # type: ignore[no-untyped-def]
    changes = apply_findings(
        session=session, job_id=job_id, findings=findings, covered_kinds=WINDOW_KINDS
    )
    follow_up(session=session, changes=changes, settings=settings)
    session.commit()
    return changes


def firing(session, incident_id: int) -> int:  # type: ignore[no-untyped-def]
    return session.scalar(
        select(func.count())
        .select_from(WebhookDelivery)
        .where(WebhookDelivery.incident_id == incident_id, WebhookDelivery.status == "firing")
    )


def actions(session, incident_id: int) -> list[Action]:  # type: ignore[no-untyped-def]
    return list(session.scalars(select(Action).where(Action.incident_id == incident_id)))


def by_kind(session, job_id):  # type: ignore[no-untyped-def]
    rows = session.scalars(select(Incident).where(Incident.job_id == job_id).order_by(Incident.id))
    return {r.kind: r for r in rows}


def test_a_slowdown_the_straggler_explains_is_its_consequence(session, settings, job_id):
    run(session, settings, job_id, [straggler(), slowdown()])

    rows = by_kind(session, job_id)
    cause, effect = rows["straggler"], rows["slowdown"]
    assert effect.evidence["consequence_of"] == cause.id
    assert f"#{cause.id}" in effect.summary and "rank 2" in effect.summary
    assert (firing(session, cause.id), firing(session, effect.id)) == (1, 0)
    assert len(actions(session, cause.id)) == 1 and actions(session, effect.id) == []


def test_a_slowdown_seen_first_is_linked_when_the_straggler_is_named(session, settings, job_id):
    run(session, settings, job_id, [slowdown(first=61)])
    effect = by_kind(session, job_id)["slowdown"]
    proposed = actions(session, effect.id)
    assert len(proposed) == 1 and proposed[0].state == "proposed"  # dump_stacks, for evidence

    run(session, settings, job_id, [straggler(), slowdown(first=61)])

    rows = by_kind(session, job_id)
    assert rows["slowdown"].evidence["consequence_of"] == rows["straggler"].id
    [action] = actions(session, effect.id)
    assert action.state == "cancelled"  # no second action for the same fault
    assert len(actions(session, rows["straggler"].id)) == 1


def test_a_slowdown_that_started_well_before_the_straggler_stays_its_own(session, settings, job_id):
    run(session, settings, job_id, [straggler(first=400), slowdown(first=100)])
    assert "consequence_of" not in by_kind(session, job_id)["slowdown"].evidence


def test_same_onset_again_is_the_same_incident(session, settings, job_id):
    first = run(session, settings, job_id, [slowdown(first=80)])
    [row] = first.opened
    run(session, settings, job_id, [])  # the window moved on: resolved by omission
    assert session.get(Incident, row.id).status == "resolved"

    again = run(session, settings, job_id, [slowdown(first=80, component="comm")])

    assert again.opened == []
    rows = list(session.scalars(select(Incident).where(Incident.job_id == job_id)))
    assert [(r.id, r.status) for r in rows] == [(row.id, "open")]
    assert rows[0].evidence["reopened"] == 1
    assert len(actions(session, row.id)) == 1  # not a second proposal
    # A later, separate episode is a new incident.
    run(session, settings, job_id, [])
    later = run(session, settings, job_id, [slowdown(first=900)])
    assert len(later.opened) == 1 and later.opened[0].id != row.id

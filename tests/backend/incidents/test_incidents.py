"""Findings become incidents: opened once, updated while they last, resolved when cleared."""

from __future__ import annotations

import numpy as np
import pytest

from backend.incidents.service import apply_findings
from detectors.finding import Finding
from tests.conftest import ADMIN, INGEST
from tests.factories import batch, step

JOB = "llama-8b-pretrain"


def straggler(rank: int = 6, *, active: bool = True, first: int = 1810, ratio: float = 1.7):
    return Finding(
        kind="straggler",
        severity="critical",
        ranks=(rank,),
        first_step=first,
        score=7.0,
        summary=f"rank {rank} is {ratio}x slower",
        key=f"straggler:{rank}",
        evidence={"ratio": ratio},
        active=active,
        last_step=None if active else first + 80,
    )


@pytest.fixture
def job_id(client, session):  # type: ignore[no-untyped-def]
    client.post("/api/v1/ingest", json=batch([step(1)]), headers=INGEST)
    from sqlalchemy import select

    from backend.jobs.models import Job

    return session.scalar(select(Job.id))


def incidents(client):  # type: ignore[no-untyped-def]
    reply = client.get(f"/api/v1/jobs/{JOB}/incidents", headers=ADMIN)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_open_update_resolve(client, session, job_id):
    first = apply_findings(
        session=session, job_id=job_id, findings=[straggler()], covered_kinds={"straggler"}
    )
    session.commit()
    assert len(first.opened) == 1
    again = apply_findings(
        session=session, job_id=job_id, findings=[straggler(ratio=1.9)], covered_kinds={"straggler"}
    )
    session.commit()
    assert (again.opened, len(again.updated)) == ([], 1)
    [row] = incidents(client)
    assert (row["kind"], row["status"], row["ranks"], row["first_step"]) == (
        "straggler",
        "open",
        [6],
        1810,
    )
    assert row["evidence"] == {"ratio": 1.9}
    assert set(row) >= {
        "id",
        "job",
        "kind",
        "severity",
        "status",
        "ranks",
        "first_step",
        "detected_at",
        "resolved_at",
        "summary",
        "evidence",
    }

    cleared = apply_findings(
        session=session, job_id=job_id, findings=[], covered_kinds={"straggler"}
    )
    session.commit()
    assert len(cleared.resolved) == 1
    [row] = incidents(client)
    assert row["status"] == "resolved" and row["resolved_at"] is not None
    one = client.get(f"/api/v1/incidents/{row['id']}", headers=ADMIN).json()
    assert one["id"] == row["id"] and one["job"] == JOB


def test_a_run_that_did_not_cover_the_kind_leaves_it_open(client, session, job_id):
    apply_findings(
        session=session, job_id=job_id, findings=[straggler()], covered_kinds={"straggler"}
    )
    apply_findings(session=session, job_id=job_id, findings=[], covered_kinds={"hang", "crash"})
    session.commit()
    assert incidents(client)[0]["status"] == "open"


def test_transient_episode_is_recorded_resolved_once(client, session, job_id):
    for _ in range(3):
        apply_findings(
            session=session,
            job_id=job_id,
            findings=[straggler(active=False)],
            covered_kinds={"straggler"},
        )
    session.commit()
    [row] = incidents(client)
    assert row["status"] == "resolved"
    assert row["evidence"]["last_step"] == 1890


def test_transient_end_resolves_the_open_incident(client, session, job_id):
    apply_findings(
        session=session, job_id=job_id, findings=[straggler()], covered_kinds={"straggler"}
    )
    changes = apply_findings(
        session=session,
        job_id=job_id,
        findings=[straggler(active=False)],
        covered_kinds={"straggler"},
    )
    session.commit()
    assert len(changes.resolved) == 1
    assert [r["status"] for r in incidents(client)] == ["resolved"]


def test_incidents_api_errors(client, job_id):
    assert client.get("/api/v1/jobs/nope/incidents", headers=ADMIN).status_code == 404
    assert client.get("/api/v1/incidents/999999", headers=ADMIN).status_code == 404
    assert client.get(f"/api/v1/jobs/{JOB}/incidents", headers=INGEST).status_code == 403
    assert (
        client.get(f"/api/v1/jobs/{JOB}/incidents?status=bogus", headers=ADMIN).status_code == 422
    )


def test_transient_episode_redated_by_a_sliding_window_is_not_recorded_twice(
    client, session, job_id
):
    for first in (1810, 1812, 1815):  # the same episode, seen from later windows
        apply_findings(
            session=session,
            job_id=job_id,
            findings=[straggler(active=False, first=first)],
            covered_kinds={"straggler"},
        )
    apply_findings(
        session=session,
        job_id=job_id,
        findings=[straggler(active=False, first=2500)],  # a new episode
        covered_kinds={"straggler"},
    )
    session.commit()
    assert sorted(i["first_step"] for i in incidents(client)) == [1810, 2500]


def hang(culprit: int, *, active: bool = True) -> Finding:
    return Finding(
        kind="hang",
        severity="critical",
        ranks=(culprit,),
        first_step=115,
        score=10.0,
        summary=f"no step finished for 10 s; culprit rank {culprit}",
        key="hang:step=115",
        evidence={"culprit_reasons": {str(culprit): "in no collective"}},
        active=active,
    )


@pytest.mark.parametrize("state", ["dispatched", "succeeded", "cancelled"])
def test_an_incident_a_restart_was_taken_on_keeps_its_diagnosis(client, session, job_id, state):
    """While a restart tears the ranks down, a re-run of the hang detector sees a killed
    rank as the culprit; the incident keeps the ranks the restart was taken on."""
    from backend.actions.models import Action
    from backend.db import utcnow

    [row] = apply_findings(
        session=session, job_id=job_id, findings=[hang(1)], covered_kinds={"hang"}
    ).opened
    session.add(
        Action(
            job_id=job_id,
            incident_id=row.id,
            kind="restart",
            state=state,
            idempotency_key=f"test-{state}",
            requested_by="policy",
            params={},
            deliveries={},
            created_at=utcnow(),
            updated_at=utcnow(),
        )
    )
    session.commit()
    changes = apply_findings(
        session=session, job_id=job_id, findings=[hang(3)], covered_kinds={"hang"}
    )
    session.commit()
    [shown] = incidents(client)
    if state == "cancelled":  # no restart under way: the diagnosis follows the detector
        assert shown["ranks"] == [3] and changes.updated
        return
    assert (shown["ranks"], shown["status"], changes.updated) == ([1], "open", [])
    assert shown["summary"].endswith("culprit rank 1")
    apply_findings(session=session, job_id=job_id, findings=[], covered_kinds={"hang"})
    session.commit()
    [shown] = incidents(client)
    assert (shown["ranks"], shown["status"]) == ([1], "resolved")


def test_a_nan_incident_keeps_its_origin_once_the_window_slides_past_the_onset(
    client, session, job_id
):
    """A NaN begins on rank 3 and spreads to every rank the next step (the all-reduce).
    Once the 200-step window starts after the onset, every rank is NaN from its first
    step: that view cannot tell where it began, and must not rename the incident's rank 3
    to all of them (seen at 512 ranks in the 10-minute load run)."""
    from detectors.numerics import detect_numerics

    loss = np.full((8, 300), 2.0)
    loss[3, 100:] = np.nan
    loss[:, 101:] = np.nan
    steps = np.arange(300)

    def apply(first: int) -> None:  # the detection window over steps first … first+199
        window = slice(first, first + 200)
        found = detect_numerics(loss[:, window], steps=steps[window], older_steps=first > 0)
        apply_findings(session=session, job_id=job_id, findings=found, covered_kinds={"nan"})
        session.commit()

    apply(0)
    [row] = incidents(client)
    assert (row["ranks"], row["first_step"]) == ([3], 100)
    apply(100)  # the onset still in the window
    apply(150)  # past it: NaN everywhere from the window's first step
    [row] = incidents(client)
    assert (row["status"], row["ranks"], row["first_step"]) == ("open", [3], 100)
    assert "first on rank 3 at step 100" in row["summary"]


def test_a_nan_from_the_jobs_first_step_is_still_updated(client, session, job_id):
    """NaN from step 0: the window starts at the job's first step, so its onset is in view
    and a later, fuller view (rank 5's step 0 came late, NaN too) updates the incident."""
    from detectors.numerics import detect_numerics

    loss = np.full((8, 50), 2.0)
    loss[[3, 5], 0] = np.nan
    loss[:, 1:] = np.nan
    sent = np.ones_like(loss, dtype=bool)
    sent[5, 0] = False  # not in yet at the first run
    for reported in (sent, np.ones_like(sent)):
        found = detect_numerics(loss, steps=np.arange(50), reported=reported)
        apply_findings(session=session, job_id=job_id, findings=found, covered_kinds={"nan"})
        session.commit()
    [row] = incidents(client)
    assert (row["ranks"], row["first_step"]) == ([3, 5], 0)


def test_a_hang_incident_keeps_its_culprit_while_the_hung_job_is_stopped(client, session, job_id):
    """Rank 3 hangs; the others wait for it in the world all-reduce. The job is then stopped
    and its ranks leave one by one, each with a goodbye: the ranks still there wait for
    ranks that exited, which the sweep names too — but the incident keeps rank 3 (seen at
    1,024 ranks: a hang renamed to 33 ranks, whole nodes, as the load run ended)."""
    from detectors.hang import Inflight, RankState, detect

    def states(alive: range) -> list[RankState]:
        waiting = Inflight(group="dp", op="all_reduce", seq=9, since=1000.0)
        return [
            RankState(r, 99, 100, 1000.0, 1059.0, inflight=None if r == 3 else waiting)
            for r in alive
        ]

    groups = {"dp": range(8)}
    for alive, exited in ((range(8), {}), (range(6), {6: 1055.0, 7: 1056.0})):
        found = detect(
            states(alive), now=1060.0, step_durations=[0.5], groups=groups, exited=exited
        )
        apply_findings(session=session, job_id=job_id, findings=found, covered_kinds={"hang"})
        session.commit()
        [row] = incidents(client)
        assert (row["kind"], row["status"], row["ranks"]) == ("hang", "open", [3])
    assert found[0].ranks == (3, 6, 7)  # the view with ranks gone, had it been taken as is
    assert found[0].evidence["culprit_reasons"]["6"] == "exited (said goodbye)"


def test_a_rank_that_left_before_the_hang_is_its_culprit(client, session, job_id):
    """Rank 7 leaves its training loop early (a goodbye, just after the last step) and
    ranks 0-6 wait for it in the all-reduce: rank 7 is the hang's culprit, and the view is
    whole (it left before the job hung), so a later view that also names rank 3 (found
    stuck too) updates the incident."""
    from detectors.hang import Inflight, RankState, detect

    waiting = Inflight(group="dp", op="all_reduce", seq=9, since=1000.0)
    for stuck in ((), (3,)):
        states = [
            RankState(r, 99, 100, 1000.0, 1059.0, inflight=None if r in stuck else waiting)
            for r in range(7)
        ]
        found = detect(
            states, now=1060.0, step_durations=[0.5], groups={"dp": range(8)}, exited={7: 1000.2}
        )
        assert found[0].evidence["culprit_reasons"]["7"] == "exited (said goodbye)"
        assert "partial_view" not in found[0].evidence
        apply_findings(session=session, job_id=job_id, findings=found, covered_kinds={"hang"})
        session.commit()
    [row] = incidents(client)
    assert row["ranks"] == [3, 7]

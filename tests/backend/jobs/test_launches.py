"""No single ingest payload can blind detection for a job's other data (issue 13, item 4):
the job follows its latest launch (``backend.jobs.launches``), an absurd attempt or a
batch of the other kind cannot take it over while the launch reports, and a relaunch
under the same name is followed."""

from __future__ import annotations

import time
from datetime import timedelta

from sqlalchemy import select, update

from backend.db import utcnow
from backend.detection.window import load_steps
from backend.jobs.launches import RELAUNCH_QUIET_S
from backend.jobs.models import Job, Rank
from backend.telemetry.models import StepRecord
from tests.conftest import ADMIN, INGEST
from tests.factories import batch, step

JOB = "llama-8b-pretrain"


def send(client, events, **fields):  # type: ignore[no-untyped-def]
    reply = client.post("/api/v1/ingest", json=batch(events, **fields), headers=INGEST)
    assert reply.status_code == 200, reply.text
    return reply.json()


def job(session) -> Job:  # type: ignore[no-untyped-def]
    session.expire_all()
    return session.scalars(select(Job).where(Job.name == JOB)).one()


def run_and_attempt(client) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """The job's current run and the attempt within it, as the API shows them."""
    body = client.get(f"/api/v1/jobs/{JOB}", headers=ADMIN).json()
    return body["run"]["number"], body["attempt"]


def window_steps(session) -> list[int]:  # type: ignore[no-untyped-def]
    window = load_steps(session=session, job_id=job(session).id)
    return [] if window is None else window.steps.tolist()


def beat(ts: float, **fields):  # type: ignore[no-untyped-def]
    return {"type": "heartbeat", "ts": ts, **fields}


def age_the_ranks(session, seconds: float) -> None:  # type: ignore[no-untyped-def]
    """Time passes without a batch: the ranks were last seen ``seconds`` ago."""
    session.execute(update(Rank).values(last_seen_at=utcnow() - timedelta(seconds=seconds)))
    session.commit()


def test_an_absurd_attempt_does_not_move_the_job(client, session):
    for rank in (0, 1):
        send(client, [step(1), step(2)], rank=rank)
    send(client, [step(99)], rank=1, attempt=5000)  # within the schema, far beyond the job
    send(client, [step(3)], rank=0)
    assert job(session).attempt == 0
    assert window_steps(session) == [1, 2, 3]
    assert session.scalar(select(StepRecord.attempt).where(StepRecord.step == 99)) == 5000


def test_a_hostile_attempt_does_not_close_open_actions(client, session):
    send(client, [step(1)], rank=0)
    action = client.post(
        f"/api/v1/jobs/{JOB}/actions", json={"kind": "dump_stacks"}, headers=ADMIN
    ).json()
    assert send(client, [], rank=1, attempt=500)["actions"] == []
    state = client.get(f"/api/v1/actions/{action['id']}", headers=ADMIN).json()["state"]
    assert state == "pending"
    assert [a["id"] for a in send(client, [], rank=0)["actions"]] == [action["id"]]


def test_a_relaunch_after_a_clean_exit_is_followed_at_once(client, session):
    now = time.time()
    for attempt in (0, 1, 2):
        send(client, [step(10 * attempt + 1)], attempt=attempt)
    send(client, [beat(now, exiting=True)], attempt=2)
    send(client, [step(1, ts=now + 1), step(2, ts=now + 2)], attempt=0)  # a new launch
    assert run_and_attempt(client) == (2, 0)  # a new run, at its attempt 0
    assert window_steps(session) == [1, 2]


def test_a_relaunch_after_a_crash_is_followed_once_the_old_launch_is_silent(client, session):
    send(client, [step(1)], attempt=0)
    send(client, [step(5)], attempt=1)  # a restart: followed at once
    assert run_and_attempt(client) == (1, 1)
    send(client, [step(1, ts=2e9)], attempt=0)  # too early to tell from a lagging rank
    assert run_and_attempt(client) == (1, 1)
    age_the_ranks(session, RELAUNCH_QUIET_S + 1)  # attempt 1 crashed: nothing since
    send(client, [step(2, ts=2e9 + 1)], attempt=0)
    assert run_and_attempt(client) == (2, 0)
    assert window_steps(session) == [2]  # the lagging step 1 was the first run's


def test_a_lagging_rank_of_an_earlier_attempt_changes_nothing(client, session):
    now = time.time()
    send(client, [beat(now), step(1)], attempt=1, world_size=4)
    send(client, [beat(now + 1, exiting=True), step(1)], attempt=0, world_size=2)
    j = job(session)
    assert (j.attempt, j.world_size) == (1, 4)
    rank = session.scalars(select(Rank)).one()
    assert (rank.attempt, rank.exited, rank.last_heartbeat_ts) == (1, False, now)


def test_a_serving_batch_first_does_not_lock_a_training_job_out(client, session):
    send(client, [], kind="serving")
    refused = client.post("/api/v1/ingest", json=batch([step(1)]), headers=INGEST)
    assert refused.status_code == 409
    detail = refused.json()["detail"]
    assert "serving job" in detail and f"{RELAUNCH_QUIET_S:.0f} s" in detail
    age_the_ranks(session, RELAUNCH_QUIET_S + 1)
    send(client, [step(1), step(2)])
    j = job(session)
    assert j.kind == "training"
    assert window_steps(session) == [1, 2]


def test_a_heartbeat_from_the_future_does_not_freeze_the_rank(client, session):
    """A rank's state follows its newest heartbeat; one stamped a day ahead (a bad clock
    or a hostile payload) must not outrank every real one after it."""
    now = time.time()
    send(client, [beat(now + 86_400, exiting=True, step=7)])
    send(client, [beat(now, step=3)])
    session.expire_all()
    rank = session.scalars(select(Rank)).one()
    assert (rank.last_heartbeat_ts, rank.current_step, rank.exited) == (now, 3, False)

"""Ranks leaving for a restart Vigil sent are not a crash.

Seen in CI (`vigil demo --fast` on a busy host): after the NaN rollback, ranks 0 and 1
exited for it but their goodbyes were lost in the bounded exit flush; 5 s later a `crash`
naming them opened and the policy restarted the job a second time.
"""

from __future__ import annotations

import time

from sqlalchemy import select

from backend.actions.models import Action
from backend.actions.service import create_action
from backend.incidents.models import Incident
from tests.backend.jobs.test_runs import beat, job_id, send, sweep
from tests.factories import step


def silent_job(client) -> None:  # type: ignore[no-untyped-def]
    """Four ranks that stepped to 20 and then all fell silent 30 s ago, no goodbye."""
    now = time.time() - 30
    for rank in range(4):
        events = [step(n, ts=now - 20 + n) for n in range(20)]
        send(client, [*events, beat(now, step=20)], rank=rank, world_size=4, run="launch-a")


def restart(session, state: str, attempt: int = 0) -> None:  # type: ignore[no-untyped-def]
    action, _ = create_action(
        session=session, job_id=job_id(session), kind="rollback", requested_by="policy"
    )
    action.state, action.attempt = state, attempt  # tests may set a state directly
    action.deliveries = {"2": {"state": state}}
    session.commit()


def opened(session) -> list[str]:  # type: ignore[no-untyped-def]
    session.expire_all()
    return [i.kind for i in session.scalars(select(Incident))]


def test_ranks_falling_silent_after_a_restart_reached_them_is_no_crash(client, session, settings):
    silent_job(client)
    restart(session, "succeeded")
    sweep(session, settings)
    assert opened(session) == []


def test_without_a_restart_the_same_silence_is_a_crash(client, session, settings):
    silent_job(client)
    restart(session, "proposed")  # never reached a rank
    sweep(session, settings)
    assert opened(session) == ["crash"]


def test_a_restart_sent_to_an_earlier_attempt_does_not_excuse_this_one(client, session, settings):
    silent_job(client)
    restart(session, "succeeded", attempt=7)
    sweep(session, settings)
    assert opened(session) == ["crash"]
    assert session.scalar(select(Action.state)) == "succeeded"

"""Recovery estimates use what is known of the run: its planned length when the collector
sent one (``vigil.init(total_steps=N)`` → a ``run_plan`` event), else they say plainly that
the horizon is assumed, and which value (the policy's ``horizon_s`` or the default).

Seen before: on a 96-second demo job the straggler's estimate read "30 h rather than
2.5 days", with nothing saying the horizon was an assumption."""

from __future__ import annotations

from typing import Any

import pytest

from backend.audit.service import list_audit
from backend.recovery import service
from backend.recovery.facts import job_timing, planned_steps
from backend.recovery.policies import put_policy
from backend.telemetry.models import JobEvent
from collector.client import Client
from collector.config import Config
from collector.transport import Outcome
from tests.backend.recovery.helpers import make_incident, make_job
from tests.conftest import INGEST
from tests.frontend.helpers import job_id

STRAGGLER = {"rank_compute_s": 0.52, "median_compute_s": 0.37, "ratio": 1.4}


def plan(session: Any, job: Any, total: object) -> None:
    session.add(JobEvent(job_id=job.id, rank=0, name="run_plan", attrs={"total_steps": total}))
    session.flush()


def reasoning(session: Any, settings: Any, job: Any, **params: Any) -> dict[str, Any]:
    """The cost model's reasoning for a rank-2 straggler: the proposed action's, or the
    audited "no action"."""
    put_policy(
        session=session, job=job.name, kind="straggler", mode="approve", actor="t", params=params
    )
    incident = make_incident(
        session, job, "straggler", ranks=(2,), evidence=STRAGGLER, first_step=40
    )
    actions = service.respond(session=session, incidents=[incident], settings=settings)
    if actions:
        return dict(actions[0].reasoning)
    entries = list_audit(session=session, job_id=job.id, incident_id=incident.id)
    [found] = [e.detail["reasoning"] for e in entries if "reasoning" in e.detail]
    return dict(found)


def test_a_planned_run_is_costed_over_what_is_left_of_it(session, settings) -> None:  # type: ignore[no-untyped-def]
    job = make_job(session, world_size=4, steps=60, step_s=0.37, checkpoint_at=None)
    plan(session, job, 260)
    r = reasoning(session, settings, job)
    assert r["horizon"] == (
        "74 s left of the run: 200 of the 260 planned steps to go after step 59, at 0.37 s a step"
    )
    assert r["facts"]["horizon_s"] == pytest.approx(74.0)
    assert r["facts"]["horizon_assumed"] is False
    texts = [r["explanation"], *(c["explanation"] for c in r["candidates"])]
    assert any("over 74 s left" in t for t in texts), texts
    assert not any(" h " in t or "days" in t for t in texts), texts  # not "30 h … 2.5 days"


def test_without_a_plan_the_default_horizon_is_said_to_be_assumed(session, settings) -> None:  # type: ignore[no-untyped-def]
    job = make_job(session, world_size=4, steps=60, step_s=0.37)
    r = reasoning(session, settings, job)
    assert r["horizon"].startswith("assumed 4 h left (the default horizon): ")
    assert "total_steps" in r["horizon"]  # and how to give the real one
    nothing = next(c for c in r["candidates"] if c["action"] is None)
    assert "over an assumed 4 h left" in nothing["explanation"]


def test_the_policys_horizon_is_an_assumption_too(session, settings) -> None:  # type: ignore[no-untyped-def]
    job = make_job(session, world_size=4, steps=60, step_s=0.37)
    r = reasoning(session, settings, job, horizon_s=36_000)
    assert r["horizon"].startswith("assumed 10 h left (the policy's horizon_s)")
    assert r["facts"]["horizon_assumed"] is True


@pytest.mark.parametrize("bad", [0, -3, "260", True, 2.5, None])
def test_a_malformed_plan_is_ignored(session, bad: object) -> None:  # type: ignore[no-untyped-def]
    job = make_job(session, world_size=4, steps=10)
    plan(session, job, bad)
    assert planned_steps(session=session, job_id=job.id) is None
    assert job_timing(session=session, job_id=job.id, attempt=0).remaining_s is None


class Recorder:
    def __init__(self) -> None:
        self.batches: list[dict[str, Any]] = []

    def send(self, batch: dict[str, Any]) -> Outcome:
        self.batches.append(batch)
        return Outcome(True)


def test_the_collector_sends_the_plan_once_and_ingest_stores_it(client, session) -> None:  # type: ignore[no-untyped-def]
    assert Config.resolve(environ={"VIGIL_TOTAL_STEPS": "260"}).total_steps == 260
    assert Config.resolve(environ={"VIGIL_TOTAL_STEPS": "-1"}).total_steps is None
    assert Config.resolve(environ={"VIGIL_TOTAL_STEPS": "many"}).total_steps is None
    recorder = Recorder()
    config = Config.resolve(job="planned", endpoint="http://127.0.0.1:9", total_steps=260)
    collector = Client(config, transport=recorder)  # type: ignore[arg-type]
    collector.flush(5)
    collector.shutdown(1)
    events = [e for b in recorder.batches for e in b["events"] if e["type"] == "event"]
    assert [(e["name"], e["attrs"]) for e in events] == [("run_plan", {"total_steps": 260})]
    for b in recorder.batches:  # what the server gets
        assert client.post("/api/v1/ingest", json=b, headers=INGEST).status_code == 200
    assert planned_steps(session=session, job_id=job_id(session, "planned")) == 260

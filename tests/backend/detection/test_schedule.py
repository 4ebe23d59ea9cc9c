"""New data → detection scheduled: ingest marks the job, the embedded ticker drains it
once per interval however many batches arrived; with detection off nothing is marked.
(The distributed path — Redis debounce and a real Celery worker — is exercised end to
end in tests/backend/test_pipeline_live.py.)"""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import select

from backend.api import create_app
from backend.detection.schedule import EmbeddedScheduler, make_scheduler
from backend.jobs.models import Job
from tests.conftest import INGEST
from tests.factories import batch, step


def test_a_burst_of_batches_schedules_one_run_per_job(settings, engine, session_factory, session):
    app = create_app(
        settings.model_copy(update={"detect_interval_s": 60}),
        engine=engine,
        session_factory=session_factory,
    )
    scheduler = app.state.detection_scheduler
    assert isinstance(scheduler, EmbeddedScheduler)
    client = TestClient(app)  # no lifespan: the ticker thread does not start
    for n in range(3):
        for job in ("a", "b"):
            reply = client.post("/api/v1/ingest", json=batch([step(n)], job=job), headers=INGEST)
            assert reply.status_code == 200, reply.text
    ids = {name: id_ for name, id_ in session.execute(select(Job.name, Job.id))}
    assert scheduler.drain() == sorted([ids["a"], ids["b"]])
    assert scheduler.drain() == []  # drained: the next tick runs nothing


def test_an_empty_batch_schedules_nothing(settings, engine, session_factory):
    app = create_app(
        settings.model_copy(update={"detect_interval_s": 60}),
        engine=engine,
        session_factory=session_factory,
    )
    reply = TestClient(app).post("/api/v1/ingest", json=batch([]), headers=INGEST)
    assert reply.status_code == 200
    assert app.state.detection_scheduler.drain() == []


def test_detection_off_means_no_scheduler(settings):
    assert make_scheduler(settings.model_copy(update={"detect_interval_s": 0})) is None
    assert isinstance(
        make_scheduler(settings.model_copy(update={"detect_interval_s": 2})), EmbeddedScheduler
    )

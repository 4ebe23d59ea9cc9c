"""Builders for dashboard tests: a job ingested through the API, incidents detected from
it, proposed actions, and the CSRF token of a rendered page."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.detection.runner import detect_job
from backend.incidents.models import Incident
from backend.jobs.models import Job
from backend.recovery import service as recovery
from backend.settings import Settings
from tests.conftest import INGEST
from tests.factories import batch

JOB = "llama-8b-pretrain"
T0 = 1_700_000_000.0
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_of(html: str) -> str:
    found = CSRF.search(html)
    assert found, "the page has no CSRF field"
    return found.group(1)


def ingest_job(
    client: TestClient,
    job: str = JOB,
    *,
    ranks: int = 4,
    steps: range = range(120),
    slow_rank: int | None = 2,
    slow_from: int = 50,
    extra: list[dict[str, Any]] | None = None,
    t0: float = T0,
) -> None:
    """Steps (with collectives and loss) of every rank through ``POST /api/v1/ingest``;
    ``slow_rank`` computes 1.4× longer from ``slow_from``; step ``n`` ends at ``t0 + n``."""
    rng = np.random.default_rng(0)
    for rank in range(ranks):
        events: list[dict[str, Any]] = []
        for n in steps:
            compute = 0.3 * (1 + rng.normal(0, 0.01))
            if rank == slow_rank and n >= slow_from:
                compute *= 1.4
            events.append(
                {
                    "type": "step",
                    "step": n,
                    "ts": t0 + n,
                    "duration_s": 0.4,
                    "comm_s": max(0.0, 0.4 - compute),
                    "loss": 2.0,
                    "mem_bytes": 1_000_000 + rank,
                }
            )
            events.append(
                {
                    "type": "collective",
                    "step": n,
                    "group": "dp",
                    "op": "all_reduce",
                    "bytes": 1_000_000,
                    "duration_s": 0.01,
                    "count": 1,
                }
            )
        events.append({"type": "heartbeat", "ts": t0 + max(steps) + 1, "step": max(steps) + 1})
        events.extend(extra or [])
        reply = client.post(
            "/api/v1/ingest",
            json=batch(events, job=job, rank=rank, world_size=ranks),
            headers=INGEST,
        )
        assert reply.status_code == 200, reply.text


def job_id(session: Session, job: str = JOB) -> int:
    found = session.scalar(select(Job.id).where(Job.name == job))
    assert found is not None
    return found


def detect(session: Session, settings: Settings, job: str = JOB) -> list[Incident]:
    """Run the detectors and the recovery policy (built-in: propose, wait for approval)."""
    changes = detect_job(session=session, job_id=job_id(session, job))
    recovery.respond(session=session, incidents=changes.opened, settings=settings)
    session.commit()
    return list(changes.opened)

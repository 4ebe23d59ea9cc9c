"""Builders for swap tests: a job that reports through ``POST /api/v1/ingest`` (heartbeats
with device capacity and the swap flag, steps with shape fingerprints and policy versions,
op sequences with their profiles), and incidents as the detectors would open them."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.jobs.models import Job
from tests.conftest import INGEST
from tests.factories import batch

JOB = "gpt-drift"
MIB = 2**20
T0 = 1_700_000_000.0
SHAPE_A, SHAPE_B = "shape-a" * 4, "shape-b" * 4
OPSEQ_A, OPSEQ_B = "opseq-a" * 4, "opseq-b" * 4


def profile(fingerprint: str, *, storages: int = 3, mib: int = 100) -> dict[str, Any]:
    """A profiled step: ``storages`` forward ops each saving ``mib`` MiB, consumed in reverse
    by as many backward ops (1 s each); 10 MiB of parameters. Peak without offload:
    ``10 + storages × mib`` MiB."""
    n = 2 * storages
    ops = [
        {
            "i": i,
            "phase": "forward" if i < storages else "backward",
            "module": f"layers.{min(i, n - 1 - i)}",
            "start_s": float(i),
            "duration_s": 1.0,
        }
        for i in range(n)
    ]
    saved = [
        {
            "id": k,
            "storage": k,
            "bytes": mib * MIB,
            "producer": k,
            "consumer": n - 1 - k,
            "last_use": n - 1 - k,
            "param": False,
        }
        for k in range(storages)
    ]
    return {
        "fingerprint": fingerprint,
        "ops": ops,
        "saved": saved,
        "param_bytes": 10 * MIB,
        "step_s": float(n),
    }


def opseq_event(
    fingerprint: str, *, with_profile: bool = True, ops: tuple[str, ...] = ("mm", "relu"), **kw: Any
) -> dict[str, Any]:
    """An op sequence of ``aten::<op>`` (on ``fingerprint``'s shapes), with its profile."""
    shapes = [[len(fingerprint), 256]]
    return {
        "type": "opseq",
        "hash": fingerprint,
        "ops": [[f"aten::{op}", shapes, 8192] for op in ops],
        "profile": profile(fingerprint, **kw) if with_profile else None,
    }


def steps(
    numbers: range,
    shape_fp: str,
    *,
    captured: str | None = None,
    policy: int | None = None,
    peak: int | None = None,
) -> list[dict[str, Any]]:
    """Step events that ran ``shape_fp``; the first carries op sequence ``captured``."""
    out = []
    for n in numbers:
        event: dict[str, Any] = {
            "type": "step",
            "step": n,
            "ts": T0 + n,
            "duration_s": 0.4,
            "comm_s": 0.05,
            "loss": 2.0,
            "mem_bytes": peak if peak is not None else 200 * MIB,
            "shape_fp": shape_fp,
        }
        if captured is not None and n == numbers.start:
            event["opseq"] = captured
        if policy is not None:
            event["swap_policy"] = policy
            event["swap_peak_bytes"] = peak
        out.append(event)
    return out


def heartbeat(step: int, capacity: int | None, *, swap: bool = True) -> dict[str, Any]:
    beat: dict[str, Any] = {"type": "heartbeat", "ts": T0 + step + 0.5, "step": step + 1}
    if capacity is not None:
        beat["mem_capacity"] = capacity
    beat["swap"] = swap
    return beat


def ingest(
    client: TestClient, events: list[dict[str, Any]], *, rank: int = 0, ranks: int = 2
) -> dict[str, Any]:
    reply = client.post(
        "/api/v1/ingest", json=batch(events, job=JOB, rank=rank, world_size=ranks), headers=INGEST
    )
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def start_job(
    client: TestClient,
    *,
    capacities: tuple[int | None, ...] = (300 * MIB, 280 * MIB),
    swap: bool = True,
    numbers: range = range(20),
    shape_fp: str = SHAPE_A,
    opseq: str | None = OPSEQ_A,
) -> None:
    """Every rank runs ``numbers`` steps of ``shape_fp`` (the first one captured as
    ``opseq``, shipped with its profile) and reports its capacity and the swap flag."""
    for rank, capacity in enumerate(capacities):
        events = steps(numbers, shape_fp, captured=opseq)
        if opseq is not None and rank == 0:
            events.append(opseq_event(opseq))
        events.append(heartbeat(numbers.stop - 1, capacity, swap=swap))
        ingest(client, events, rank=rank, ranks=len(capacities))


def run(client: TestClient, events: list[dict[str, Any]], ranks: int = 2) -> None:
    """The same events from every rank (op-sequence events only from rank 0)."""
    for rank in range(ranks):
        mine = [e for e in events if rank == 0 or e["type"] != "opseq"]
        ingest(client, mine, rank=rank, ranks=ranks)


def job_of(session: Session) -> Job:
    job = session.scalar(select(Job).where(Job.name == JOB))
    assert job is not None
    return job

"""Issue 14's detection through the real pipeline: data in through the ingest API, the
detection runner (``detect_job``), incidents out of the REST API.

- ``memory_pressure`` runs once heartbeats report each rank's device capacity;
- ``opseq_change`` opens when a new shape fingerprint becomes the steady state, within a
  few steps of the change, with the evidence ``backend.swap`` reads."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from backend.detection.opseq import load_opseq
from backend.detection.runner import detect_job
from backend.detection.window import load_steps
from backend.jobs.models import Job
from tests.conftest import ADMIN, INGEST
from tests.factories import batch

JOB = "gpt-curriculum"
T0 = 1_700_000_000.0
MIB = 2**20
RANKS = 4


def post(client, rank: int, events: list[dict[str, Any]]) -> None:  # type: ignore[no-untyped-def]
    body = batch(events, job=JOB, rank=rank, world_size=RANKS)
    reply = client.post("/api/v1/ingest", json=body, headers=INGEST)
    assert reply.status_code == 200, reply.text


def steps(
    client,
    numbers: range,
    *,
    shape=lambda n: None,
    opseq=lambda n: None,
    mem=lambda n: None,
    capacity: int | None = None,
    extra: dict[int, list[dict[str, Any]]] | None = None,
) -> None:  # type: ignore[no-untyped-def]
    """Every rank reports ``numbers`` (one batch each), then a heartbeat."""
    for rank in range(RANKS):
        events: list[dict[str, Any]] = list((extra or {}).get(rank, []))
        for n in numbers:
            event = {"type": "step", "step": n, "ts": T0 + n, "duration_s": 0.3, "loss": 2.0}
            fields = {"shape_fp": shape(n), "opseq": opseq(n), "mem_bytes": mem(n)}
            events.append({**event, **{k: v for k, v in fields.items() if v is not None}})
        beat: dict[str, Any] = {"type": "heartbeat", "ts": T0 + numbers[-1] + 0.5}
        if capacity is not None:
            beat["mem_capacity"] = capacity
        post(client, rank, [*events, beat])


def detect(client, session) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    job_id = session.scalar(select(Job.id).where(Job.name == JOB))
    detect_job(session=session, job_id=job_id)
    session.commit()
    return client.get(f"/api/v1/jobs/{JOB}/incidents", headers=ADMIN).json()  # type: ignore[no-any-return]


def growing(n: int) -> int:
    return (600 + 3 * n) * MIB  # 600 MiB → 957 MiB over 120 steps: full in ~15 steps


def test_memory_pressure_opens_when_ranks_report_capacity(client, session):
    steps(client, range(120), mem=growing, capacity=1000 * MIB)
    found = [i for i in detect(client, session) if i["kind"] == "memory_pressure"]
    assert len(found) == 1, found
    assert found[0]["status"] == "open" and found[0]["evidence"]["capacity_gib"] == 0.98


def test_no_memory_pressure_without_capacity(client, session):
    steps(client, range(120), mem=growing)
    assert [i for i in detect(client, session) if i["kind"] == "memory_pressure"] == []


def ops(names: list[str], width: int) -> list[list[Any]]:
    return [[name, [[8, width]], 64] for name in names]


def shape(n: int) -> str:
    return "shape-short" if n < 100 else "shape-long"


def test_an_op_sequence_change_opens_one_incident_within_ten_steps(client, session):
    steps(client, range(102), shape=shape)
    steps(client, range(102, 103), shape=shape, opseq=lambda n: "op-long")  # a capture
    steps(client, range(103, 104), shape=shape)
    assert [i for i in detect(client, session) if i["kind"] == "opseq_change"] == []  # 4 steps

    steps(client, range(104, 105), shape=shape)
    found = [i for i in detect(client, session) if i["kind"] == "opseq_change"]
    assert len(found) == 1, found
    [incident] = found
    assert (incident["severity"], incident["status"], incident["ranks"]) == ("info", "open", [])
    assert incident["first_step"] == 100
    evidence = incident["evidence"]
    assert (evidence["from_shape_fp"], evidence["to_shape_fp"]) == ("shape-short", "shape-long")
    assert (evidence["from_opseq"], evidence["to_opseq"]) == (None, "op-long")
    assert evidence["change"] == "unknown"  # the short sequence was never captured
    assert evidence["steady_steps"] == 5

    steps(client, range(105, 130), shape=shape)  # later runs update the same incident
    found = [i for i in detect(client, session) if i["kind"] == "opseq_change"]
    assert [(i["id"], i["status"]) for i in found] == [(incident["id"], "open")]


def test_a_shape_change_is_told_from_a_structural_one(client, session):
    sequences = {
        "op-short": ["aten::mm", "aten::relu"],
        "op-long": ["aten::mm", "aten::relu"],  # the same ops on longer sequences
        "op-moe": ["aten::mm", "aten::topk", "aten::relu"],  # another structure
    }
    captured = [
        {"type": "opseq", "hash": h, "ops": ops(names, 128 if h == "op-short" else 256)}
        for h, names in sequences.items()
    ]

    def shape_of(n: int) -> str:
        return "s-short" if n < 100 else "s-long" if n < 140 else "s-moe"

    def opseq_of(n: int) -> str | None:
        return {10: "op-short", 101: "op-long", 141: "op-moe"}.get(n)

    steps(client, range(120), shape=shape_of, opseq=opseq_of, extra={0: captured})
    [first] = [i for i in detect(client, session) if i["kind"] == "opseq_change"]
    assert (first["evidence"]["to_shape_fp"], first["evidence"]["change"]) == ("s-long", "shapes")
    assert first["evidence"]["from_opseq"] == "op-short"

    steps(client, range(120, 150), shape=shape_of, opseq=opseq_of)
    found = [i for i in detect(client, session) if i["kind"] == "opseq_change"]
    changes = {i["evidence"]["to_shape_fp"]: (i["status"], i["evidence"]["change"]) for i in found}
    assert changes == {"s-long": ("resolved", "shapes"), "s-moe": ("open", "structure")}


def test_a_job_that_never_changes_opens_nothing(client, session):
    steps(client, range(120), shape=lambda n: "steady")
    assert [i for i in detect(client, session) if i["kind"] == "opseq_change"] == []


def test_the_opseq_part_reads_no_grid_in_a_steady_state(client, session):
    steps(client, range(300), shape=lambda n: "steady")
    job_id = session.scalar(select(Job.id).where(Job.name == JOB))
    window = load_steps(session=session, job_id=job_id)
    part = load_opseq(session=session, job_id=job_id, window=window)
    assert part is not None and part.fingerprints == () and part.job_first_step == 0
    assert int(window.steps[0]) == 100  # the fingerprint is older than the window


def test_a_job_without_fingerprints_has_no_opseq_part(client, session):
    steps(client, range(20))
    job_id = session.scalar(select(Job.id).where(Job.name == JOB))
    window = load_steps(session=session, job_id=job_id)
    assert load_opseq(session=session, job_id=job_id, window=window) is None

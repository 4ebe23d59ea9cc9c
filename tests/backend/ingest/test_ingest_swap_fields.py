"""The activation-swap fields of the ingest contract (issue 14): stored where they belong,
refused with the field named (and nothing stored) when bad; ``shape_fingerprints`` kept
per job with one statement per batch that writes nothing in a steady state."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import delete, func, select, text
from sqlalchemy.orm import Session

from backend.ingest.shapes import add_shape_fingerprints, structure_hash
from backend.jobs.models import Job, Rank
from backend.swap.models import ShapeFingerprint
from backend.telemetry.models import OpSequence, StepRecord
from tests.conftest import INGEST
from tests.factories import batch, step

BEAT_TS = 1_732_233_500.0


def post(client, events: list[dict[str, Any]], **fields: Any):  # type: ignore[no-untyped-def]
    return client.post("/api/v1/ingest", json=batch(events, **fields), headers=INGEST)


def stored(client, events: list[dict[str, Any]], **fields: Any) -> None:  # type: ignore[no-untyped-def]
    reply = post(client, events, **fields)
    assert reply.status_code == 200, reply.text


def beat(ts: float = BEAT_TS, **fields: Any) -> dict[str, Any]:
    return {"type": "heartbeat", "ts": ts, **fields}


def fingerprints(session: Session) -> dict[str, tuple[int, int, str | None]]:
    rows = session.execute(
        select(
            ShapeFingerprint.shape_fp,
            ShapeFingerprint.first_step,
            ShapeFingerprint.first_rank,
            ShapeFingerprint.opseq,
        )
    ).all()
    return {r.shape_fp: (r.first_step, r.first_rank, r.opseq) for r in rows}


def test_step_swap_fields_are_stored(client, session):
    stored(client, [step(7, shape_fp="s-a", swap_policy=3, swap_peak_bytes=2**40), step(8)])
    rows = session.execute(
        select(
            StepRecord.step, StepRecord.shape_fp, StepRecord.swap_policy, StepRecord.swap_peak_bytes
        ).order_by(StepRecord.step)
    ).all()
    assert [tuple(r) for r in rows] == [(7, "s-a", 3, 2**40), (8, None, None, None)]


def test_heartbeat_capacity_and_swap_go_onto_the_rank(client, session):
    stored(client, [beat(mem_capacity=80 * 2**30, swap=True)], rank=2)
    rank = session.scalar(select(Rank).where(Rank.rank == 2))
    assert (rank.mem_capacity, rank.swap_capable) == (80 * 2**30, True)
    # A later heartbeat without a capacity keeps the known one; its swap flag is the news.
    stored(client, [beat(BEAT_TS + 1)], rank=2)
    session.expire_all()
    rank = session.scalar(select(Rank).where(Rank.rank == 2))
    assert (rank.mem_capacity, rank.swap_capable) == (80 * 2**30, False)
    # A late batch with an older heartbeat changes nothing.
    stored(client, [beat(BEAT_TS - 10, mem_capacity=1, swap=True)], rank=2)
    session.expire_all()
    rank = session.scalar(select(Rank).where(Rank.rank == 2))
    assert (rank.mem_capacity, rank.swap_capable) == (80 * 2**30, False)


def test_a_rank_that_never_reports_capacity_has_none(client, session):
    stored(client, [step(1), beat()])
    rank = session.scalar(select(Rank))
    assert (rank.mem_capacity, rank.swap_capable) == (None, False)


def opseq(hash_: str, names: list[str], shape: int = 8, **fields: Any) -> dict[str, Any]:
    ops = [[name, [[shape, 4]], 64] for name in names]
    return {"type": "opseq", "hash": hash_, "ops": ops, **fields}


def test_opseq_profile_and_structure_are_stored(client, session):
    profile = {"version": 1, "fingerprint": "o1", "ops": [{"i": 0}], "saved": []}
    stored(
        client,
        [
            opseq("o1", ["aten::mm", "aten::relu"], profile=profile),
            opseq("o2", ["aten::mm", "aten::relu"], shape=16),  # same ops, other shapes
            opseq("o3", ["aten::mm", "aten::gelu"]),
        ],
    )
    rows = {r.hash: r for r in session.scalars(select(OpSequence))}
    assert rows["o1"].profile == profile and rows["o2"].profile is None
    assert rows["o1"].structure == rows["o2"].structure != rows["o3"].structure
    assert len(rows["o1"].structure) == 16


def test_structure_hash_is_over_the_names_in_order_and_their_count():
    assert structure_hash(["aten::mm", "aten::relu"]) != structure_hash(["aten::mm"])
    assert structure_hash(["aten::mm", "aten::relu"]) != structure_hash(["aten::relu", "aten::mm"])
    assert structure_hash(["a\nb"]) != structure_hash(["a", "b"])  # the count tells them apart
    assert len(structure_hash([])) == 16
    assert structure_hash(["\ud800"])  # a lone surrogate from JSON hashes, never raises


def test_shape_fingerprints_keep_the_first_step_and_the_first_opseq(client, session):
    stored(
        client,
        [
            step(n, shape_fp="a" if n < 20 else "b", opseq="op-b" if n == 21 else None)
            for n in range(10, 30)
        ],
        rank=1,
    )
    assert fingerprints(session) == {"a": (10, 1, None), "b": (20, 1, "op-b")}
    # A lagging rank's earlier step moves first_step back, with its rank.
    stored(client, [step(n, shape_fp="a", opseq=None) for n in (8, 9)], rank=0)
    # A captured step fills a missing opseq; a second one does not replace it.
    stored(client, [step(25, shape_fp="a", opseq="op-a")], rank=2)
    stored(client, [step(26, shape_fp="a", opseq="op-a2"), step(27, shape_fp="b", opseq="x")])
    session.expire_all()
    assert fingerprints(session) == {"a": (8, 0, "op-a"), "b": (20, 1, "op-b")}


def test_a_steady_batch_writes_no_fingerprint_row(client, session):
    stored(client, [step(n, shape_fp="a", opseq="op-a") for n in range(5)])
    job_id = session.scalar(select(Job.id))
    again = [step(n, shape_fp="a", opseq="op-a") for n in range(5, 10)]
    assert add_shape_fingerprints(session=session, job_id=job_id, rank=3, steps=again) == 0
    assert add_shape_fingerprints(session=session, job_id=job_id, rank=3, steps=[]) == 0
    new = [step(10, shape_fp="b", opseq=None)]
    assert add_shape_fingerprints(session=session, job_id=job_id, rank=3, steps=new) == 1


def test_ingest_adds_one_statement_per_batch_for_fingerprints(client, session, engine):
    stored(client, [step(0, shape_fp="a")])
    seen: list[str] = []

    def count(conn, cursor, statement, *args):  # type: ignore[no-untyped-def]
        if "shape_fingerprints" in statement:
            seen.append(statement)

    from sqlalchemy import event

    event.listen(engine, "before_cursor_execute", count)
    try:
        stored(client, [step(n, shape_fp="ab"[n % 2]) for n in range(1, 200)])
        stored(client, [step(n) for n in range(200, 210)])  # no fingerprints: no statement
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(seen) == 1


def test_a_steady_batch_locks_no_fingerprint_row(db_url, engine):
    """Every rank of a job carries the same fingerprints: a steady-state batch must leave
    their rows unlocked, or the job's ingest would queue on them (PostgreSQL)."""
    if not db_url.startswith("postgresql"):
        pytest.skip("row locks: PostgreSQL")
    with engine.begin() as conn:
        job_id = conn.scalar(
            Job.__table__.insert().values(name="swap-lock-test", kind="training").returning(Job.id)
        )
        conn.execute(
            ShapeFingerprint.__table__.insert().values(
                job_id=job_id, shape_fp="a", first_step=0, first_rank=0, opseq="op-a"
            )
        )
    try:
        with engine.connect() as one, engine.connect() as two:
            one.begin()
            with Session(bind=one) as s:
                steady = [step(n, shape_fp="a", opseq="op-a") for n in range(3)]
                assert add_shape_fingerprints(session=s, job_id=job_id, rank=1, steps=steady) == 0
                two.begin()
                locked = text(
                    "SELECT 1 FROM shape_fingerprints WHERE job_id = :j FOR UPDATE NOWAIT"
                )
                assert two.execute(locked, {"j": job_id}).all() == [(1,)]  # not locked by one
                two.rollback()
            one.rollback()
    finally:
        with engine.begin() as conn:
            conn.execute(delete(Job).where(Job.id == job_id))


TABLES = (StepRecord, Job, Rank, OpSequence, ShapeFingerprint)

BAD = [
    ("swap_policy negative", [step(1, swap_policy=-1)], "events[0].swap_policy"),
    ("swap_policy 2**31", [step(1, swap_policy=2**31)], "events[0].swap_policy"),
    ("swap_policy bool", [step(1, swap_policy=True)], "events[0].swap_policy"),
    ("swap_peak_bytes 2**63", [step(1, swap_peak_bytes=2**63)], "events[0].swap_peak_bytes"),
    ("swap_peak_bytes float", [step(1, swap_peak_bytes=1.5)], "events[0].swap_peak_bytes"),
    ("shape_fp empty", [step(1, shape_fp="")], "events[0].shape_fp"),
    ("shape_fp 65 chars", [step(1, shape_fp="f" * 65)], "events[0].shape_fp"),
    ("shape_fp NUL", [step(1, shape_fp="a\x00")], "events[0].shape_fp"),
    ("shape_fp number", [step(1, shape_fp=12)], "events[0].shape_fp"),
    ("mem_capacity negative", [beat(mem_capacity=-1)], "events[0].mem_capacity"),
    ("mem_capacity 2**63", [beat(mem_capacity=2**63)], "events[0].mem_capacity"),
    ("mem_capacity text", [beat(mem_capacity="80GB")], "events[0].mem_capacity"),
    ("swap not a bool", [beat(swap="sometimes")], "events[0].swap"),
    ("op not a list", [{"type": "opseq", "hash": "h", "ops": ["aten::mm"]}], "events[0].ops"),
    ("op without a name", [{"type": "opseq", "hash": "h", "ops": [[3, [], 0]]}], "events[0].ops"),
    ("op empty", [{"type": "opseq", "hash": "h", "ops": [["aten::mm"], []]}], "events[0].ops"),
    ("op name empty", [{"type": "opseq", "hash": "h", "ops": [["", [], 0]]}], "events[0].ops"),
    ("profile a list", [opseq("h", ["aten::mm"], profile=[1])], "events[0].profile"),
    ("profile NaN", [opseq("h", ["aten::mm"], profile={"x": float("nan")})], "events[0].profile"),
]


@pytest.mark.parametrize(("what", "events", "field"), BAD, ids=[c[0] for c in BAD])
def test_bad_swap_field_is_a_422_naming_it_and_nothing_stored(client, session, what, events, field):
    # A good step rides along: nothing of the batch may be stored.
    reply = client.post(
        "/api/v1/ingest",
        content=_json(batch([*events, step(2, shape_fp="ok")])),
        headers={**INGEST, "Content-Type": "application/json"},
    )
    assert reply.status_code == 422, f"{what}: {reply.status_code} {reply.text[:300]}"
    fields = [e["field"] for e in reply.json()["detail"]]
    assert field in fields, f"{what}: reply named {fields}"
    if "ops" in field:
        assert "ops[" in reply.text  # the bad op's index is named in the message
    assert all(session.scalar(select(func.count()).select_from(m)) == 0 for m in TABLES)


def _json(body: dict[str, Any]) -> str:
    import json

    return json.dumps(body)  # NaN as the literal NaN, as a broken collector would send it

"""Hostile values in any field of any event are a 4xx naming the field, never a 5xx, and
nothing of the batch is stored, on SQLite and PostgreSQL alike (issue 13, item 1).

A 5xx is retried by the collector forever, so one bad string (a NUL byte, which a
PostgreSQL text column refuses), an integer wider than its column, or a float that
overflows a rollup's sum would black out the rank for good.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import func, select

from backend.ingest.models import IngestBatch
from backend.jobs.models import Job, Rank
from backend.telemetry.models import (
    CollectiveRecord,
    CollectiveRollup,
    JobEvent,
    MetricPoint,
    OpSequence,
    ServingMinute,
    ServingRequest,
    StepRecord,
    StepRollup,
)
from tests.conftest import INGEST
from tests.factories import batch, every_event_type, step

TABLES = (
    Job,
    Rank,
    IngestBatch,
    StepRecord,
    StepRollup,
    CollectiveRecord,
    CollectiveRollup,
    OpSequence,
    ServingRequest,
    ServingMinute,
    MetricPoint,
    JobEvent,
)

NUL = "bad\x00value"
EVENTS = {e["type"]: e for e in every_event_type()}
EVENTS["action"] = {"type": "action", "id": 1, "state": "acked", "ts": 1.0, "result": {}}
EVENTS["request"]["token_times"] = {"enc": "dv1", "data": "ZGQ="}  # 2 tokens after the first
EVENTS["request"]["output_tokens"] = 3
EVENTS["request"]["queue_s"] = 0.1
EVENTS["request"]["model"], EVENTS["request"]["replica"] = "m", "r0"
EVENTS["collective"]["members"] = [0, 1]
EVENTS["heartbeat"]["pid"] = 123
EVENTS["heartbeat"]["dropped"] = {"queue_full": 1}
EVENTS["event"]["ts"] = 1.0
EVENTS["metric"]["ts"] = 1.0


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


def event_case(etype: str, path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    event = json.loads(json.dumps(EVENTS[etype]))
    _set(event, path, value)
    return batch([step(1), event], kind="serving" if etype == "request" else "training")


def envelope_case(field: str, value: Any) -> dict[str, Any]:
    return batch([step(1)], **{field: value})


BIG31, BIG63, BIG64 = 2**31, 2**63, 2**64
FAR = 1e308  # two of these overflow a sum
# (case name, batch, the field the reply must name)
CASES: list[tuple[str, dict[str, Any], str]] = [
    # the envelope
    ("host NUL", envelope_case("host", NUL), "host"),
    ("job NUL", envelope_case("job", NUL), "job"),
    ("batch_id NUL", envelope_case("batch_id", NUL), "batch_id"),
    ("rank 2**31", envelope_case("rank", BIG31), "rank"),
    ("rank 2**63", envelope_case("rank", BIG63), "rank"),
    ("world_size 2**63", envelope_case("world_size", BIG63), "world_size"),
    ("attempt 2**31", envelope_case("attempt", BIG31), "attempt"),
    ("attempt 2**64", envelope_case("attempt", BIG64), "attempt"),
    ("attempt 1e6", envelope_case("attempt", 1_000_000), "attempt"),
]
for etype, path, value in [
    # strings with a NUL
    ("step", ("opseq",), NUL),
    ("collective", ("group",), NUL),
    ("collective", ("op",), NUL),
    ("heartbeat", ("inflight", "group"), NUL),
    ("heartbeat", ("inflight", "op"), NUL),
    ("opseq", ("hash",), NUL),
    ("opseq", ("ops", 0, 0), NUL),
    ("request", ("id",), NUL),
    ("request", ("status",), NUL),
    ("request", ("model",), NUL),
    ("request", ("replica",), NUL),
    ("request", ("token_times", "data"), NUL),
    ("metric", ("name",), NUL),
    ("event", ("name",), NUL),
    ("event", ("attrs", "path"), NUL),
    ("event", ("attrs", "nested"), {"deeper": [1, {"k": NUL}]}),
    ("action", ("result", "why"), NUL),
    # integers beyond their column
    ("step", ("step",), BIG63),
    ("step", ("mem_bytes",), BIG63),
    ("step", ("tokens",), BIG64),
    ("collective", ("step",), BIG64),
    ("collective", ("seq",), BIG63),
    ("collective", ("bytes",), BIG64),
    ("collective", ("count",), BIG31),
    ("collective", ("members", 1), BIG31),
    ("collective", ("members", 1), BIG63),
    ("heartbeat", ("step",), BIG63),
    ("heartbeat", ("pid",), BIG31),
    ("heartbeat", ("pid",), BIG63),
    ("heartbeat", ("inflight", "seq"), BIG63),
    ("heartbeat", ("dropped", "queue_full"), BIG63),
    ("request", ("prompt_tokens",), BIG31),
    ("request", ("output_tokens",), BIG63),
    ("request", ("token_times", "stride"), BIG31),
    ("metric", ("step",), BIG63),
    ("event", ("step",), BIG64),
    ("event", ("attrs", "n"), BIG64),
    ("action", ("id",), BIG31),
    ("action", ("id",), BIG63),
    # floats that overflow a column, a bin's sum or a minute number
    ("step", ("ts",), FAR),
    ("step", ("duration_s",), FAR),
    ("step", ("comm_s",), FAR),
    ("step", ("data_s",), FAR),
    ("collective", ("duration_s",), FAR),
    ("heartbeat", ("ts",), FAR),
    ("heartbeat", ("inflight", "since"), FAR),
    ("request", ("arrival",), FAR),
    ("request", ("max_tbt_s",), FAR),
    ("request", ("queue_s",), FAR),
    ("metric", ("ts",), FAR),
    ("event", ("ts",), FAR),
    ("action", ("ts",), FAR),
]:
    # Free-form JSON (attrs, ops, result) is named down to its own field.
    named = path[:1] if path[0] in ("attrs", "ops", "result") else path
    field = "events[1]" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in named)
    shown = "NUL" if isinstance(value, (str, dict)) else f"{value:.3g}"
    CASES.append(
        (f"{etype}.{'.'.join(map(str, path))} {shown}", event_case(etype, path, value), field)
    )


def stored_rows(session) -> dict[str, int]:  # type: ignore[no-untyped-def]
    counts = {m.__tablename__: session.scalar(select(func.count()).select_from(m)) for m in TABLES}
    return {name: n for name, n in counts.items() if n}


@pytest.mark.parametrize(("what", "body", "field"), CASES, ids=[c[0] for c in CASES])
def test_hostile_value_is_a_4xx_naming_the_field(client, session, what, body, field):
    reply = client.post("/api/v1/ingest", json=body, headers=INGEST)
    assert reply.status_code == 422, f"{what}: {reply.status_code} {reply.text[:300]}"
    fields = [e["field"] for e in reply.json()["detail"]]
    assert any(
        f == field or f.startswith(field + ".") or f.startswith(field + "[") for f in fields
    ), f"{what}: reply named {fields}, not {field}"
    assert stored_rows(session) == {}


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_number_inside_attrs_is_refused(client, session, literal):
    """JSON columns cannot hold NaN/Infinity on PostgreSQL; free-form attrs are checked."""
    text = json.dumps(batch([step(1), {**EVENTS["event"], "attrs": {"x": 0.5}}]))
    reply = client.post(
        "/api/v1/ingest",
        content=text.replace("0.5}", f"{literal}}}"),
        headers={**INGEST, "Content-Type": "application/json"},
    )
    assert reply.status_code == 422, reply.text
    assert reply.json()["detail"][0]["field"].startswith("events[1].attrs")
    assert stored_rows(session) == {}


def test_nul_in_an_attrs_key_is_refused(client, session):
    body = batch([step(1), {**EVENTS["event"], "attrs": {"a": {"pa\x00th": 1}}}])
    reply = client.post("/api/v1/ingest", json=body, headers=INGEST)
    assert reply.status_code == 422, reply.text
    assert reply.json()["detail"][0]["field"].startswith("events[1].attrs")
    assert stored_rows(session) == {}


def test_nul_in_a_dropped_reason_is_refused(client, session):
    beat = {**EVENTS["heartbeat"], "dropped": {"queue\x00full": 3}}
    reply = client.post("/api/v1/ingest", json=batch([beat]), headers=INGEST)
    assert reply.status_code == 422, reply.text
    assert reply.json()["detail"][0]["field"].startswith("events[0].dropped")
    assert stored_rows(session) == {}


def test_large_durations_in_one_bin_across_batches_never_overflow(client, session):
    """The largest duration accepted, many times in one rollup bin, sums without a 5xx
    (two 1e308 would overflow a float sum: the schema's bound keeps sums finite)."""
    from backend.ingest.schemas import MAX_DURATION_S

    for _ in range(2):
        events = [step(n, duration_s=MAX_DURATION_S, comm_s=MAX_DURATION_S) for n in range(8)]
        reply = client.post("/api/v1/ingest", json=batch(events), headers=INGEST)
        assert reply.status_code == 200, reply.text
    total = session.scalar(select(func.sum(StepRollup.sum_duration)).where(StepRollup.level == 0))
    assert total == 16 * MAX_DURATION_S


def test_signals_keep_nan_and_inf(client, session):
    """loss, grad_norm and a metric's value may be NaN/Inf: that is what detectors look for."""
    text = json.dumps(
        batch([step(1, loss=0.25, grad_norm=0.75), {"type": "metric", "name": "m", "value": 0.5}])
    )
    text = text.replace("0.25", "NaN").replace("0.75", "Infinity").replace("0.5}", "-Infinity}")
    reply = client.post(
        "/api/v1/ingest", content=text, headers={**INGEST, "Content-Type": "application/json"}
    )
    assert reply.status_code == 200, reply.text
    assert session.scalar(select(func.count()).select_from(MetricPoint)) == 1


def test_rebuilt_rollups_sum_the_largest_byte_counts(client, session):
    """Rebuilding the collective rollups sums bytes as floats: two records of 2**62 bytes
    overflow SQLite's integer sum()."""
    from backend.telemetry.rollups import rebuild_rollups

    big = {**EVENTS["collective"], "bytes": 2**62}
    reply = client.post("/api/v1/ingest", json=batch([big, big]), headers=INGEST)
    assert reply.status_code == 200, reply.text
    job_id = session.scalar(select(Job.id))
    rebuild_rollups(session=session, job_id=job_id)
    total = session.scalar(select(CollectiveRollup.sum_bytes).where(CollectiveRollup.level == 0))
    assert total == float(2**63)


def test_plain_attrs_that_only_look_hostile_are_kept(client, session):
    """The text ``\\u0000`` (a backslash, then u0000) and long digit strings are fine."""
    attrs = {"path": "C:\\u0000dir", "id": "12345678901234567890123", "n": 2**63 - 1}
    body = batch([{**EVENTS["event"], "attrs": attrs}])
    reply = client.post("/api/v1/ingest", json=body, headers=INGEST)
    assert reply.status_code == 200, reply.text
    assert session.scalars(select(JobEvent.attrs)).one() == attrs

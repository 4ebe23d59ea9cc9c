"""Request events with token times (``dv1``), queue time, model and replica: stored when
good; a bad token array is a 422 naming the field, and nothing of the batch is stored."""

from __future__ import annotations

import base64

import pytest
from sqlalchemy import func, select

from backend.ingest.tokens import decode_offsets, recorded_indices
from backend.telemetry.models import ServingMinute, ServingRequest
from tests.conftest import INGEST
from tests.factories import batch

T0 = 1_732_233_000.0
TIMES = "events[1].token_times"
DATA = f"{TIMES}.data"


def varints(values: list[int]) -> bytes:
    out = bytearray()
    for v in values:
        while True:
            byte, v = v & 0x7F, v >> 7
            out.append(byte | (0x80 if v else 0))
            if not v:
                break
    return bytes(out)


def token_times(deltas_100us: list[int], stride: int = 1) -> dict[str, object]:
    return {
        "enc": "dv1",
        "stride": stride,
        "data": base64.b64encode(varints(deltas_100us)).decode(),
    }


def request(**fields: object) -> dict[str, object]:
    event: dict[str, object] = {
        "type": "request",
        "id": "r-1",
        "arrival": T0,
        "first_token": T0 + 0.2,
        "end": T0 + 0.5,
        "prompt_tokens": 100,
        "output_tokens": 4,
        "status": "ok",
        "model": "tiny-gpt",
        "replica": "r0",
        "queue_s": 0.05,
        "token_times": token_times([1000, 1000, 1000]),  # +100 ms each
    }
    event.update(fields)
    return event


def post(client, events):  # type: ignore[no-untyped-def]
    return client.post(
        "/api/v1/ingest", json=batch(events, job="chat", kind="serving"), headers=INGEST
    )


def test_token_times_are_stored_and_decode_to_what_was_sent(client, session):
    reply = post(client, [request()])
    assert reply.status_code == 200, reply.text
    row = session.scalars(select(ServingRequest)).one()
    assert (row.model, row.replica, row.queue_s, row.token_stride) == ("tiny-gpt", "r0", 0.05, 1)
    offsets = decode_offsets(row.token_deltas, stride=1, output_tokens=4)
    assert offsets == pytest.approx([0.0, 0.1, 0.2, 0.3])
    minute = session.scalars(select(ServingMinute)).one()
    assert (minute.replica, minute.requests, minute.errors, minute.ttft_n) == (
        "tiny-gpt/r0",
        1,
        0,
        1,
    )
    assert minute.ttft_sum == pytest.approx(0.2)
    assert minute.tpot_sum == pytest.approx(0.1)  # (0.5 - 0.2) / (4 - 1)


def test_sampled_token_times_carry_every_strideth_token_and_the_last(client, session):
    assert recorded_indices(10, 4) == [0, 4, 8, 9]
    event = request(output_tokens=10, end=T0 + 1.2, token_times=token_times([4000, 4000, 1000], 4))
    assert post(client, [event]).status_code == 200
    row = session.scalars(select(ServingRequest)).one()
    assert decode_offsets(row.token_deltas, stride=4, output_tokens=10) == pytest.approx(
        [0.0, 0.4, 0.8, 0.9]
    )


def test_old_request_events_stay_valid(client, session):
    old = {"type": "request", "id": "r-0", "arrival": T0, "first_token": T0 + 0.1, "end": T0 + 1}
    assert post(client, [old]).status_code == 200
    assert session.scalar(select(func.count()).select_from(ServingRequest)) == 1


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"token_times": token_times([1000, 1000])}, DATA, "need 3"),
        ({"token_times": token_times([1000] * 5)}, DATA, "need 3"),
        ({"token_times": {"enc": "dv1", "data": "not base64!"}}, DATA, "base64"),
        ({"token_times": {"enc": "dv1", "data": base64.b64encode(b"\x80").decode()}},
         DATA, "inside a varint"),
        ({"token_times": token_times([1000, 1000, 90000])}, DATA, "after end"),
        ({"token_times": {"enc": "zstd", "data": ""}}, "events[1].token_times.enc", ""),
        ({"token_times": token_times([1]), "first_token": None}, TIMES, "first_token"),
        ({"output_tokens": 2**31}, "events[1].output_tokens", ""),
        ({"output_tokens": 2**31 - 1}, DATA, "raise the stride"),
        ({"queue_s": -1}, "events[1].queue_s", ""),
    ],
)  # fmt: skip
def test_bad_token_times_are_422_naming_the_field_and_store_nothing(
    client, session, fields, field, says
):  # type: ignore[no-untyped-def]
    good = request(id="ok-1")
    reply = post(client, [good, request(**fields)])
    assert reply.status_code == 422, reply.text
    [error] = [e for e in reply.json()["detail"] if e["field"] == field]
    assert says in error["msg"]
    assert session.scalar(select(func.count()).select_from(ServingRequest)) == 0
    assert session.scalar(select(func.count()).select_from(ServingMinute)) == 0

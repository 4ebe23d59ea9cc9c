"""``vigil.serving.Request``: the request event it queues, the ``dv1`` token-time encoding
(round trips against a reference decoder written here from the spec), exact max TBT under
sampling, the ``with`` error path, and the no-op before ``init()``.

Times come from a fake clock put in place of the module's monotonic and wall clocks, so
every expected value is exact."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import math
import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import collector
import collector as vigil
from collector import serving
from collector.client import Client
from collector.config import Config
from collector.serving import Request, encode_token_times, recorded_indices, stride_for
from collector.transport import Outcome

HALF_UNIT = 50e-6 + 1e-9  # rounding to 100 µs, plus float noise


# -- a reference decoder, from the spec in collector/serving.py ---------------------------


def varints(raw: bytes) -> list[int]:
    out, value, shift = [], 0, 0
    for byte in raw:
        value |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
        else:
            out.append(value)
            value, shift = 0, 0
    assert shift == 0, "data ends inside a varint"
    return out


def decode(token_times: dict[str, Any], output_tokens: int) -> dict[int, float]:
    """Offsets from first_token, in seconds, of the recorded tokens, by token index."""
    assert token_times["enc"] == "dv1"
    stride = token_times.get("stride", 1)
    raw = base64.b64decode(token_times["data"], validate=True)
    assert base64.b64encode(raw).decode() == token_times["data"]  # standard, padded
    indices = list(range(0, output_tokens, stride))
    if indices[-1] != output_tokens - 1:
        indices.append(output_tokens - 1)
    deltas = varints(raw)
    assert len(deltas) == len(indices) - 1
    offsets, total = {0: 0.0}, 0
    for i, d in zip(indices[1:], deltas, strict=True):
        total += d
        offsets[i] = total * 1e-4
    return offsets


# -- fixtures ------------------------------------------------------------------------------


class Recorder:
    """A transport that keeps every batch (as the server would parse it)."""

    def __init__(self) -> None:
        self.batches: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def send(self, batch: dict[str, Any]) -> Outcome:
        with self.lock:
            self.batches.append(json.loads(json.dumps(batch)))
        return Outcome(True)

    def requests(self) -> list[dict[str, Any]]:
        assert collector.flush(10)
        with self.lock:
            return [e for b in self.batches for e in b["events"] if e["type"] == "request"]


@contextlib.contextmanager
def capture(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    """A live collector whose batches land in a ``Recorder`` instead of a server."""
    recorder = Recorder()
    config = Config.resolve(job="serving-test", endpoint="http://127.0.0.1:9", kind="serving")
    client = Client(config, transport=recorder)  # type: ignore[arg-type]
    monkeypatch.setattr(collector, "_client", client)
    try:
        yield recorder
    finally:
        client.shutdown(1)


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    with capture(monkeypatch) as recorder:
        yield recorder


class Clock:
    """Stands in for ``time.monotonic`` and ``time.time`` (wall = monotonic + offset)."""

    def __init__(self, start: float = 1000.0, wall_offset: float = 1.7e9) -> None:
        self.t, self.offset = start, wall_offset

    def mono(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.t + self.offset

    def advance(self, dt: float) -> None:
        self.t += dt


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(serving, "_mono", c.mono)
    monkeypatch.setattr(serving, "_wall", c.wall)
    return c


def stream(
    clock: Clock, r: Request, gaps: list[float], chunk: list[int] | None = None
) -> list[float]:
    """Deliver tokens after each gap (``chunk[i]`` tokens at a time); returns every token's
    monotonic time, one entry per token."""
    times: list[float] = []
    for i, gap in enumerate(gaps):
        clock.advance(gap)
        n = chunk[i] if chunk else 1
        r.token(n)
        times += [clock.t] * n
    return times


def check_times(event: dict[str, Any], times: list[float], arrival_mono: float) -> None:
    """The event's first token, token times and max TBT against the true times."""
    wall0 = event["arrival"]
    assert event["first_token"] == pytest.approx(wall0 + times[0] - arrival_mono, abs=1e-6)
    offsets = decode(event["token_times"], event["output_tokens"])
    for i, offset in offsets.items():
        assert abs(offset - (times[i] - times[0])) <= HALF_UNIT, i
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert event["max_tbt_s"] == pytest.approx(max(gaps), abs=1e-9)


# -- the encoding ----------------------------------------------------------------------------


def test_docstring_example_and_varint_widths():
    assert encode_token_times([5.0, 5.01, 5.03, 5.0428]) == "ZMgBgAE="
    assert encode_token_times([1.0]) == ""
    # 1-, 2- and 3-byte deltas: 12.7 ms, 1.6383 s, 1.6384 s
    raw = base64.b64decode(encode_token_times([0.0, 0.0127, 1.651, 3.2894]))
    assert raw == bytes([127, 0xFF, 0x7F, 0x80, 0x80, 0x01])
    assert varints(raw) == [127, 16383, 16384]


@pytest.mark.parametrize("seed", range(5))
def test_encoder_round_trip_random_times(seed: int):
    rng = random.Random(seed)
    n = rng.randint(2, 3000)
    t, times = rng.uniform(0, 1e5), []
    for _ in range(n):
        times.append(t)
        t += rng.choice([0.0, rng.uniform(0, 0.005), rng.uniform(0.005, 0.2), rng.uniform(0, 5)])
    data = encode_token_times(times)
    offsets = decode({"enc": "dv1", "stride": 1, "data": data}, n)
    assert max(abs(offsets[i] - (times[i] - times[0])) for i in range(n)) <= HALF_UNIT


def test_no_drift_over_100k_tokens():
    """Offsets are rounded, not the deltas: the error never grows past half a unit."""
    gap = 0.012_345_67  # never a whole number of units
    times = [1234.5 + i * gap for i in range(100_000)]
    offsets = decode({"enc": "dv1", "data": encode_token_times(times)}, len(times))
    errors = [abs(offsets[i] - (times[i] - times[0])) for i in range(len(times))]
    assert max(errors) <= HALF_UNIT
    assert (
        abs(offsets[99_999] - 99_999 * gap) <= HALF_UNIT
    )  # a delta rounding would be off by ~0.3 s


def test_a_time_going_backwards_is_sent_as_no_gap():
    offsets = decode({"enc": "dv1", "data": encode_token_times([0.0, 0.5, 0.4, 0.6])}, 4)
    assert offsets == pytest.approx({0: 0.0, 1: 0.5, 2: 0.5, 3: 0.6})


def test_stride_is_the_smallest_power_of_two_that_fits():
    for limit in (2, 3, 64, 4096):
        for n in [1, 2, limit - 1, limit, limit + 1, 2 * limit, 2 * limit + 1, 10**5]:
            if n < 1:
                continue
            k = stride_for(n, limit)
            assert k & (k - 1) == 0
            assert len(recorded_indices(n, k)) <= limit
            assert k == 1 or len(recorded_indices(n, k // 2)) > limit
    assert (stride_for(4096), stride_for(4097), stride_for(100_000)) == (1, 2, 32)


# -- the request event -------------------------------------------------------------------------


def test_a_streamed_request(captured: Recorder, clock: Clock):
    arrival = clock.t
    r = vigil.serving.Request(id="r-1", prompt_tokens=512, model="llama-8b", replica="pod-3")
    clock.advance(0.02)
    r.scheduled()
    gaps = [0.2] + [0.011, 0.03, 0.0004, 0.25, 0.01] * 20
    times = stream(clock, r, gaps)
    clock.advance(0.003)
    r.end()
    (event,) = captured.requests()
    assert event["arrival"] == pytest.approx(arrival + clock.offset)
    assert event["end"] == pytest.approx(event["arrival"] + clock.t - arrival)
    assert event["first_token"] - event["arrival"] == pytest.approx(0.22)
    assert event["queue_s"] == pytest.approx(0.02)
    assert {k: event[k] for k in ("id", "status", "prompt_tokens", "model", "replica")} == {
        "id": "r-1",
        "status": "ok",
        "prompt_tokens": 512,
        "model": "llama-8b",
        "replica": "pod-3",
    }
    assert event["output_tokens"] == len(times) == 101
    assert event["token_times"]["stride"] == 1
    check_times(event, times, arrival)
    assert event["max_tbt_s"] == pytest.approx(0.25)


@pytest.mark.parametrize("n", [63, 64, 65, 127, 128, 129, 1000, 2049, 5000])
def test_long_outputs_are_sampled_and_max_tbt_stays_exact(
    captured: Recorder, clock: Clock, monkeypatch: pytest.MonkeyPatch, n: int
):
    monkeypatch.setattr(serving, "_limit_for", (collector._client, 64))
    monkeypatch.setattr(serving, "_FOLD_AT", 50)  # fold often, across every boundary
    rng = random.Random(n)
    gaps = [0.1] + [rng.uniform(0.005, 0.03) for _ in range(n - 1)]
    worst = 2 * (n // 3) + 1  # odd: never a sampled index when the stride is > 1
    gaps[min(worst, n - 1)] = 0.75
    arrival = clock.t
    r = Request()
    times = stream(clock, r, gaps)
    r.end()
    (event,) = captured.requests()
    stride = event["token_times"]["stride"]
    assert stride == stride_for(n, 64)
    assert len(decode(event["token_times"], n)) <= 64
    check_times(event, times, arrival)
    assert event["max_tbt_s"] == pytest.approx(0.75)


def test_chunks_of_several_tokens_including_long_runs(
    captured: Recorder, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(serving, "_limit_for", (collector._client, 100))
    monkeypatch.setattr(serving, "_FOLD_AT", 64)
    rng = random.Random(7)
    chunks = [rng.choice([1, 1, 2, 3, 5, 40, 70, 300]) for _ in range(200)]
    gaps = [0.05] + [rng.uniform(0.001, 0.04) for _ in range(199)]
    gaps[101] = 0.5
    arrival = clock.t
    r = Request()
    times = stream(clock, r, gaps, chunks)
    r.end()
    (event,) = captured.requests()
    assert event["output_tokens"] == sum(chunks)
    assert event["token_times"]["stride"] == stride_for(sum(chunks), 100)
    check_times(event, times, arrival)


def test_100k_tokens_at_the_default_limit(captured: Recorder, clock: Clock):
    arrival = clock.t
    r = Request()
    times = stream(clock, r, [0.3] + [0.012_345_67] * 99_999)
    r.end()
    (event,) = captured.requests()
    assert event["token_times"]["stride"] == 32
    offsets = decode(event["token_times"], 100_000)
    assert len(offsets) <= 4096
    assert max(offsets) == 99_999
    check_times(event, times, arrival)


def test_first_token_then_a_reported_count(captured: Recorder, clock: Clock):
    """A server that knows only its first token and the final count: TTFT, no token times."""
    r = Request()
    clock.advance(0.4)
    r.first_token()
    r.first_token()  # ignored: the first token is already recorded
    clock.advance(1.0)
    r.end(output_tokens=57, prompt_tokens=9)
    (event,) = captured.requests()
    assert event["first_token"] - event["arrival"] == pytest.approx(0.4)
    assert event["output_tokens"] == 57 and event["prompt_tokens"] == 9
    assert "token_times" not in event and "max_tbt_s" not in event


def test_a_count_that_differs_from_the_timed_tokens_drops_only_the_token_times(
    captured: Recorder, clock: Clock
):
    r = Request()
    stream(clock, r, [0.1, 0.02, 0.3, 0.02])  # 4 chunks, but the server says 9 tokens
    r.end(output_tokens=9)
    (event,) = captured.requests()
    assert event["output_tokens"] == 9
    assert event["max_tbt_s"] == pytest.approx(0.3)
    assert "token_times" not in event


def test_a_non_streamed_response_delivers_everything_at_the_end(captured: Recorder, clock: Clock):
    r = Request()
    clock.advance(2.5)
    r.end(output_tokens=300)
    (event,) = captured.requests()
    assert event["first_token"] == event["end"] == pytest.approx(event["arrival"] + 2.5)
    assert event["output_tokens"] == 300 and "token_times" not in event


def test_end_counts_once_and_later_tokens_are_ignored(captured: Recorder, clock: Clock):
    r = Request()
    stream(clock, r, [0.1, 0.1])
    r.end(status="rejected")
    r.token()
    r.end()
    (event,) = captured.requests()
    assert event["status"] == "rejected" and event["output_tokens"] == 2


def test_without_end_and_without_tokens(captured: Recorder, clock: Clock):
    with Request():
        clock.advance(0.1)
    (event,) = captured.requests()
    assert event["status"] == "ok" and event["end"] - event["arrival"] == pytest.approx(0.1)
    assert "output_tokens" not in event and "first_token" not in event  # unknown, not zero


def test_fields_the_server_would_refuse_are_left_out_or_trimmed(captured: Recorder):
    Request(id="x" * 300, prompt_tokens=-1, model="m" * 200, replica="").end(
        status="", output_tokens=2_000_000, queue_s=float("nan")
    )
    Request(id="", prompt_tokens=True).end(status="x" * 40, output_tokens="12")  # type: ignore[arg-type]
    first, second = captured.requests()
    assert len(first["id"]) == 128 and len(first["model"]) == 128
    assert first["status"] == "error"
    for key in ("prompt_tokens", "output_tokens", "queue_s", "replica"):
        assert key not in first
    assert second["id"] and second["id"] != first["id"]  # generated
    assert len(second["status"]) == 32 and "prompt_tokens" not in second
    assert "output_tokens" not in second


def test_generated_ids_are_unique(captured: Recorder):
    for _ in range(50):
        Request().end()
    assert len({e["id"] for e in captured.requests()}) == 50


# -- the with block ------------------------------------------------------------------------------


def test_an_exception_in_the_body_ends_the_request_as_error_and_propagates(
    captured: Recorder, clock: Clock
):
    boom = ValueError("model fell over")
    with pytest.raises(ValueError) as raised, Request(id="r-err") as r:
        stream(clock, r, [0.1, 0.05])
        raise boom
    assert raised.value is boom
    (event,) = captured.requests()
    assert event["status"] == "error" and event["output_tokens"] == 2


def test_a_cancelled_task_is_a_client_abort(captured: Recorder):
    async def handler(started: asyncio.Event) -> None:
        with Request(id="r-cancel") as r:
            r.token()
            started.set()
            await asyncio.sleep(10)

    async def main() -> None:
        started = asyncio.Event()
        task = asyncio.create_task(handler(started))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    (event,) = captured.requests()
    assert event["status"] == "aborted_by_client"


def test_an_explicit_end_inside_the_block_wins(captured: Recorder):
    with Request() as r:
        r.end(status="rejected")
    (event,) = captured.requests()
    assert event["status"] == "rejected"


# -- a guest in the server ---------------------------------------------------------------------


def test_a_failure_inside_vigil_never_reaches_the_caller(
    captured: Recorder, monkeypatch: pytest.MonkeyPatch
):
    client = collector.get_client()
    assert client is not None

    def broken(event: object) -> None:
        raise RuntimeError("vigil bug")

    monkeypatch.setattr(client, "submit", broken)
    r = Request()
    r.token()
    r.end()  # no exception
    monkeypatch.setattr(serving, "_FOLD_AT", 1)
    monkeypatch.setattr(serving, "max_token_times", lambda: 1 / 0)
    r = Request()
    r.token()
    r.token(5)
    r.end()
    assert client.worker.dropped["bad_request"] == 2


def test_a_full_queue_drops_and_counts(monkeypatch: pytest.MonkeyPatch):
    config = Config.resolve(job="serving-test", endpoint="http://127.0.0.1:9", max_queue=100)
    client = Client(config, transport=Recorder())  # type: ignore[arg-type]
    monkeypatch.setattr(client.worker, "_ensure_thread", lambda: None)  # nobody drains
    monkeypatch.setattr(collector, "_client", client)
    for _ in range(130):
        Request().end()
    assert client.worker.dropped["queue_full"] == 30


def test_before_init_every_call_is_a_cheap_no_op(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("VIGIL_ENDPOINT", raising=False)
    assert vigil.init(job="x") is False
    threads = threading.active_count()
    r = vigil.serving.Request(id="r", prompt_tokens=3)
    assert r is Request() and type(r).__name__ == "_NoopRequest"
    r.scheduled()
    r.first_token()
    r.token()
    r.token(4)
    r.end(status="ok", output_tokens=5)
    with pytest.raises(KeyError), vigil.serving.Request() as r2:
        r2.token()
        raise KeyError("still propagates")
    assert threading.active_count() == threads
    import timeit

    per_call = min(timeit.repeat(lambda: Request().token(), number=20_000, repeat=3)) / 20_000
    assert per_call < 5e-6  # near-free (about 0.2 µs on the dev box)


def test_the_event_passes_the_ingest_contract(captured: Recorder, clock: Clock):
    """What the collector sends validates against the backend's ingest schema."""
    schemas = pytest.importorskip("backend.ingest.schemas")
    if "token_times" not in schemas.RequestEvent.__annotations__:
        pytest.skip("the backend does not take token_times yet")
    r = Request(prompt_tokens=10, model="m", replica="r")
    r.scheduled()
    stream(clock, r, [0.1] + [0.02] * 5000)
    r.end()
    with Request() as r2:
        r2.token()
    Request().end(status="aborted_by_client")
    events = captured.requests()
    batch = {"batch_id": "b-1", "job": "serving-test", "kind": "serving", "events": events}
    parsed = schemas.IngestBatch.model_validate(batch).model_dump()
    assert schemas.check_request_times(parsed["events"]) == []
    tokens = pytest.importorskip("backend.ingest.tokens")
    sent = events[0]["token_times"]
    theirs = tokens.decode_offsets(sent["data"], stride=sent["stride"], output_tokens=5001)
    ours = decode(sent, 5001)
    assert theirs == pytest.approx([ours[i] for i in sorted(ours)], abs=1e-9)
    assert math.isclose(events[0]["max_tbt_s"], 0.02, rel_tol=1e-6)  # TTFT is not a TBT

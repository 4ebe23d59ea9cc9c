"""The serving ingest benchmark sends what the ingest contract accepts: request events with
``dv1`` token times that decode to the times it generated, and its COPY rows are the rows
ingest itself would write."""

from __future__ import annotations

import base64
import gzip
import itertools
import math
from typing import Any

import orjson
import pytest

from backend.ingest.schemas import IngestBatch, check_request_times
from backend.ingest.service import _request_row
from backend.ingest.tokens import decode_offsets
from bench.ingest import ApiRun, Tally, report_api_run
from bench.ingest_requests import REQUEST_COLUMNS, encode_batches, make_requests, request_row


def _validated(body: bytes) -> tuple[IngestBatch, list[dict[str, Any]]]:
    """The batch as the server parses it, and its events (checked as the server checks them)."""
    batch = IngestBatch.model_validate_json(body)
    events: list[dict[str, Any]] = batch.events  # type: ignore[assignment]
    assert check_request_times(events) == []
    return batch, events


def test_batches_validate_and_spread_over_replicas() -> None:
    raw = make_requests(250, tokens=200, replicas=3, batch=50, rate=100)
    batches = encode_batches(raw, job="bench-serving", use_gzip=False)
    assert [len(b.events) for b in batches] == [50] * 5
    seen_ids: set[str] = set()
    for i, b in enumerate(batches):
        batch, events = _validated(b.body)
        assert (batch.kind, batch.job, batch.rank, batch.world_size) == (
            "serving",
            "bench-serving",
            0,
            1,
        )
        assert {e["replica"] for e in events} == {f"pod-{i % 3}"}
        arrivals = [e["arrival"] for e in events]
        assert arrivals == sorted(arrivals)
        for e in events:
            assert e["type"] == "request"
            assert 150 <= e["output_tokens"] <= 250
            assert e["arrival"] <= e["first_token"] <= e["end"]
            assert e["token_times"]["stride"] == 1
            offsets = e["_token_offsets"]
            assert len(offsets) == e["output_tokens"]
            gaps = [b - a for a, b in itertools.pairwise(offsets)]
            assert max(gaps) == pytest.approx(e["max_tbt_s"], abs=2e-4)
            seen_ids.add(e["id"])
    assert len(seen_ids) == 250


def test_token_times_round_trip_and_long_outputs_are_strided() -> None:
    raw = make_requests(20, tokens=6000, replicas=1, batch=20, rate=10, seed=4)
    (body,) = (b.body for b in encode_batches(raw, job="long", use_gzip=True))
    _, events = _validated(gzip.decompress(body))
    for sent, e in zip(raw[0][1], events, strict=True):
        times = e["token_times"]
        assert times["stride"] == 2  # 4,500-7,500 tokens: more than 4,096 at stride 1
        offsets = decode_offsets(
            times["data"], stride=times["stride"], output_tokens=e["output_tokens"]
        )
        # the last recorded token ends the request, within the 100 µs rounding
        assert e["first_token"] + offsets[-1] == pytest.approx(sent["end"] - 2e-4, abs=1e-4)


def test_copy_rows_are_the_rows_ingest_writes() -> None:
    (_, events), *_ = make_requests(5, tokens=30, replicas=2, batch=5, rate=10)
    for e in events:
        expected = _request_row(e, {"job_id": 7, "rank": 0})
        assert tuple(expected) == REQUEST_COLUMNS
        assert request_row(7, e) == tuple(expected.values())
        assert request_row(7, e)[-1] == base64.b64decode(e["token_times"]["data"])


def test_report_keeps_the_step_benchmarks_keys_and_names_requests() -> None:
    tally = Tally(events=2000, batches=2, latencies=[0.1, 0.2])
    run = ApiRun(tally, 0.5, 0.01, None, math.nan, math.nan)
    assert list(report_api_run(run)) == [
        "events",
        "batches",
        "seconds",
        "events_per_s",
        "p50_ms",
        "p99_ms",
        "errors",
        "throttled_429",
        "client_cpu_s",
    ]
    summary = report_api_run(ApiRun(tally, 0.5, 0.01, 1, 0.06, 0.04), noun="request")
    assert summary["requests_per_s"] == 4000
    assert summary["server_us_per_request"] == 30.0
    assert summary["pg_us_per_request"] == 20.0
    assert orjson.loads(orjson.dumps(summary)) == summary

"""``vigil replay`` against the example model server (a real process on a free port): the
trace's requests go out at their times with their sizes, the client's measurements agree
with what the server saw, and the records reach a Vigil ingest endpoint."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from backend.cli import app
from backend.serving.replay import Outcome, Replay, ReplayError, ReplayOptions, endpoint_url
from backend.serving.report import summarize
from backend.serving.traces import TraceRequest, read_trace
from examples.serving.model_server import ServerConfig
from tests.examples.model_servers import model_server_process, served
from tests.servers import Receiver

DATA = Path(__file__).resolve().parents[2] / "data" / "serving"
AZURE = DATA / "AzureLLMInferenceTrace_conv_first300.csv"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with model_server_process("--max-batch", "32") as url:
        yield url


class Recorded:
    """Stands in for the collector's request timer; keeps the calls."""

    made: list[Recorded]

    def __init__(self, request_id: str, prompt_tokens: int, model: str | None) -> None:
        self.id, self.prompt_tokens, self.model = request_id, prompt_tokens, model
        self.tokens = 0
        self.first = 0
        self.ended: tuple[str, int | None] | None = None

    def first_token(self, n: int = 1) -> None:
        self.first += 1

    def token(self, n: int = 1) -> None:
        self.tokens += n

    def end(self, status: str = "ok", output_tokens: int | None = None) -> None:
        self.ended = (status, output_tokens)


def records() -> tuple[list[Recorded], Any]:
    made: list[Recorded] = []

    def open_record(request_id: str, prompt_tokens: int, model: str | None) -> Recorded:
        made.append(Recorded(request_id, prompt_tokens, model))
        return made[-1]

    return made, open_record


def test_the_trace_goes_out_on_time_and_is_measured(server: str):
    trace = read_trace(AZURE, limit=24).requests  # 6.4 s of real arrivals
    made, open_record = records()
    run = Replay(trace, ReplayOptions(target=server, speedup=20), record=open_record)
    started = time.time()
    outcomes = asyncio.run(run.play())
    assert (run.model, run.prompt_mode, run.api) == ("tiny-llm", "count", "completions")
    assert [o.status for o in outcomes] == ["ok"] * 24
    seen = {o.index: o for o in outcomes}
    for req in trace:
        out = seen[req.index]
        assert out.max_tokens == out.output_tokens == len(out.token_s) == req.output_tokens
        assert out.sent_s == pytest.approx(req.arrival_s / 20, abs=0.25)
        assert out.ttft_s is not None and out.ttft_s > 0
    assert max(o.lag_s for o in outcomes) < 0.25

    # What the server saw, by the ids the replay sent as X-Request-Id.
    log = {r["id"]: r for r in httpx.get(server + "/debug/requests").json()}
    for out in outcomes:
        row = log[out.id]
        req = trace[out.index]
        assert (row["prompt_tokens"], row["output_tokens"]) == (
            req.prompt_tokens,
            out.output_tokens,
        )
        assert row["arrival"] >= started
        server_ttft = row["first_token"] - row["arrival"]
        assert out.ttft_s is not None
        assert server_ttft - 0.01 < out.ttft_s < server_ttft + 0.5
        assert row["end"] - row["arrival"] < out.end_s - out.sent_s + 0.01

    # What the collector was told, as it happened.
    assert sorted(r.id for r in made) == sorted(o.id for o in outcomes)
    for rec in made:
        out = next(o for o in outcomes if o.id == rec.id)
        assert rec.first == 1 and rec.tokens == out.output_tokens - 1
        assert rec.ended == ("ok", out.output_tokens)
        assert rec.model == "tiny-llm" and rec.prompt_tokens == trace[out.index].prompt_tokens

    summary = summarize(outcomes)
    assert (summary.sent, summary.ok, summary.failed) == (24, 24, 0)
    assert summary.output_tokens == sum(r.output_tokens for r in trace)
    assert summary.ttft_s[50] is not None and summary.tpot_s[99] is not None
    assert summary.ttft_s[50] <= summary.ttft_s[90] <= summary.ttft_s[99]


def test_vigil_replay_reports_what_the_client_saw(server: str, tmp_path: Path):
    summary_file = tmp_path / "summary.json"
    with Receiver() as rx:
        result = CliRunner().invoke(
            app,
            [
                "replay", str(AZURE), "--target", server, "--job", "chat-replay",
                "--limit", "8", "--speedup", "50", "--endpoint", rx.url(),
                "--token", "vigil-dev-ingest", "--json", str(summary_file),
            ],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        batches = [_batch(r["body"]) for r in rx.received("/api/v1/ingest")]  # type: ignore[arg-type]
    assert "TTFT" in result.output and "TPOT" in result.output
    assert "sent 8" in result.output and "ok 8" in result.output
    assert {(b["job"], b["kind"]) for b in batches} == {("chat-replay", "serving")}
    events = [e for b in batches for e in b["events"] if e["type"] == "request"]
    trace = read_trace(AZURE, limit=8).requests
    assert len(events) == 8
    for event in events:
        req = trace[int(event["id"].rsplit("-", 1)[1])]
        assert (event["prompt_tokens"], event["output_tokens"]) == (
            req.prompt_tokens,
            req.output_tokens,
        )
        assert event["status"] == "ok" and event["model"] == "tiny-llm"
        assert event["arrival"] < event["first_token"] <= event["end"]
        assert event["token_times"]["stride"] == 1  # every token's arrival
    summary = json.loads(summary_file.read_text())
    assert (summary["sent"], summary["ok"]) == (8, 8)
    assert summary["tokens_per_s"] > 0


@pytest.mark.parametrize(
    ("chaos", "status", "code"),
    [("errors:rate=1", "error", 500), ("shed:max_waiting=0", "rejected", 429)],
)
def test_failures_are_counted_by_kind(chaos: str, status: str, code: int):
    trace = [TraceRequest(i, i * 0.01, 10, 5) for i in range(6)]
    made, open_record = records()
    with served(ServerConfig(chaos=chaos)) as url:
        outcomes = asyncio.run(Replay(trace, ReplayOptions(target=url), record=open_record).play())
    assert {(o.status, o.http_status) for o in outcomes} == {(status, code)}
    assert all(o.error and str(code) in o.error for o in outcomes)
    assert {r.ended for r in made} == {(status, 0)}
    summary = summarize(outcomes)
    assert (summary.ok, summary.failed, summary.by_status) == (0, 6, {status: 6})


def test_an_unreachable_target_is_an_error_per_request():
    trace = [TraceRequest(0, 0.0, 10, 5)]
    options = ReplayOptions(target="http://127.0.0.1:9", model="m", prompt_mode="words")
    (out,) = asyncio.run(Replay(trace, options, record=records()[1]).play())
    assert out.status == "error" and "ConnectError" in (out.error or "")
    with pytest.raises(ReplayError, match="give --model"):
        asyncio.run(Replay(trace, ReplayOptions(target="http://127.0.0.1:9")).play())


def test_request_bodies_and_targets():
    assert endpoint_url("http://h:8000", "completions")[1] == "http://h:8000/v1/completions"
    assert endpoint_url("http://h:8000/v1/", "chat")[1] == "http://h:8000/v1/chat/completions"
    assert endpoint_url("http://h/v1/chat/completions", "completions") == (
        "http://h",
        "http://h/v1/chat/completions",
        "chat",
    )
    with pytest.raises(ReplayError):
        endpoint_url("h:8000", "completions")
    req = TraceRequest(0, 0.0, prompt_tokens=4, output_tokens=7)
    words = Replay([], ReplayOptions(target="http://h", model="m", prompt_mode="words"))
    assert words.body(req) == {
        "model": "m",
        "max_tokens": 7,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "prompt": "hi hi hi hi",
    }
    chat = Replay([], ReplayOptions(target="http://h", model="m", api="chat", prompt_mode="count"))
    body = chat.body(req)
    assert body["prompt_tokens"] == 4 and body["messages"] == [{"role": "user", "content": ""}]


def test_summary_percentiles():
    outcomes = []
    for i in range(100):
        o = Outcome(i, f"r{i}", 10, 3, due_s=0.0, sent_s=0.0, status="ok", output_tokens=3)
        o.token_s.extend([0.01 * (i + 1), 0.01 * (i + 1) + 0.1, 0.01 * (i + 1) + 0.2])
        o.end_s = 0.01 * (i + 1) + 0.2
        outcomes.append(o)
    s = summarize(outcomes, duration_s=2.0)
    assert s.ttft_s[50] == pytest.approx(0.505)
    assert s.ttft_s[99] == pytest.approx(0.9901)
    assert s.tpot_s[90] == pytest.approx(0.1)
    assert s.tokens_per_s == 150.0 and s.requests_per_s == 50.0


def _batch(body: bytes) -> dict[str, Any]:
    if body[:2] == b"\x1f\x8b":
        body = gzip.decompress(body)
    return dict(json.loads(body))

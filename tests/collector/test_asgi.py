"""``VigilMiddleware`` around an OpenAI-style app of our own: streamed chat and completions
with known pauses, non-streamed replies, error statuses, client disconnects, malformed
streams, and, end to end, uvicorn serving the app to a real HTTP client while the collector
ships to a real ``vigil server``."""

from __future__ import annotations

import asyncio
import base64
import gzip
import importlib.util
import itertools
import json
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, StreamingResponse

import collector
from collector.integrations import asgi
from collector.integrations.asgi import VigilMiddleware
from collector.serving import Request
from tests.collector.test_serving import Recorder, capture, decode
from tests.servers import Receiver, free_port, live_server

MODEL = "tiny-llm"
PROMPT_TOKENS = 7
TOL = 0.03  # seconds: scheduling noise on a shared 2-core machine


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    with capture(monkeypatch) as recorder:
        yield recorder


def compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def sse(obj: Any) -> str:
    return f"data: {compact(obj)}\n\n"


def chat_chunk(rid: str, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def make_app() -> FastAPI:
    """An OpenAI-compatible server in miniature. The request body says how to answer:
    ``rid``, ``stream``, ``tokens``, ``ttft``, ``gap``, ``usage``, ``status``, ``fail_at``.
    Every answer is logged in ``app.state.log[rid]`` with the handler's start and the
    monotonic time each token chunk was yielded."""
    app = FastAPI()
    app.state.log = {}

    @app.post("/v1/chat/completions")
    async def chat(request: HttpRequest) -> Any:
        body = await request.json()
        rid, n = body["rid"], body.get("tokens", 5)
        ttft, gap = body.get("ttft", 0.05), body.get("gap", 0.02)
        record: dict[str, Any] = {"start": time.monotonic(), "tokens": []}
        app.state.log[rid] = record
        if body.get("status"):
            error = {"error": {"message": "no", "code": body["status"]}}
            return JSONResponse(error, status_code=body["status"])
        usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": n, "total_tokens": 7 + n}
        if not body.get("stream"):
            await asyncio.sleep(ttft + gap * n)
            message = {"role": "assistant", "content": "hi " * n}
            return JSONResponse(
                {
                    "id": rid,
                    "object": "chat.completion",
                    "model": MODEL,
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": usage,
                }
            )

        async def tokens() -> AsyncIterator[str]:
            await asyncio.sleep(ttft)
            yield sse(chat_chunk(rid, {"role": "assistant", "content": ""}))
            for i in range(n):
                if i:
                    await asyncio.sleep(gap)
                if body.get("fail_at") == i:
                    raise RuntimeError("engine died")
                record["tokens"].append(time.monotonic())
                yield sse(chat_chunk(rid, {"content": f" t{i}"}))
            yield sse(chat_chunk(rid, {}, finish="stop"))
            if body.get("usage"):
                yield sse({**chat_chunk(rid, {}), "choices": [], "usage": usage})
            yield "data: [DONE]\n\n"

        return StreamingResponse(tokens(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: HttpRequest) -> Any:
        body = await request.json()
        rid, n, gap = body["rid"], body.get("tokens", 5), body.get("gap", 0.02)
        record: dict[str, Any] = {"start": time.monotonic(), "tokens": []}
        app.state.log[rid] = record

        async def text() -> AsyncIterator[str]:
            for i in range(n):
                await asyncio.sleep(gap)
                record["tokens"].append(time.monotonic())
                choice = {"index": 0, "text": f" w{i}", "logprobs": None, "finish_reason": None}
                yield sse(
                    {"id": rid, "object": "text_completion", "model": MODEL, "choices": [choice]}
                )
            yield "data: [DONE]\n\n"

        return StreamingResponse(text(), media_type="text/event-stream")

    @app.post("/v1/embeddings")
    async def embeddings() -> Any:
        return {"data": []}

    @app.get("/v1/chat/completions")
    async def not_a_post() -> Any:
        return {"ok": True}

    return app


async def post(app: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.post(path, json=body)


def by_id(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in events}


def check_against_log(event: dict[str, Any], record: dict[str, Any], tol: float = TOL) -> None:
    """TTFT and every token time as the app saw them, within ``tol``."""
    times = record["tokens"]
    ttft = event["first_token"] - event["arrival"]
    assert ttft == pytest.approx(times[0] - record["start"], abs=tol)
    offsets = decode(event["token_times"], event["output_tokens"])
    for i, offset in offsets.items():
        assert offset == pytest.approx(times[i] - times[0], abs=tol), i
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert event["max_tbt_s"] == pytest.approx(max(gaps), abs=tol)


# -- through httpx's ASGI transport ---------------------------------------------------------


def test_a_streamed_chat_completion(captured: Recorder):
    app = make_app()
    body = {"rid": "chat-1", "stream": True, "tokens": 6, "ttft": 0.15, "gap": 0.04, "usage": True}
    plain = asyncio.run(post(app, "/v1/chat/completions", {**body, "rid": "chat-0"}))
    reply = asyncio.run(post(VigilMiddleware(app), "/v1/chat/completions", body))
    assert reply.status_code == 200
    assert reply.text == plain.text.replace("chat-0", "chat-1")  # passed through unchanged
    event = by_id(captured.requests())["chat-1"]
    client = collector.get_client()
    assert client is not None
    assert event["status"] == "ok" and event["model"] == MODEL
    assert event["replica"] == client.config.host
    assert event["output_tokens"] == 6 and event["prompt_tokens"] == PROMPT_TOKENS
    assert event["first_token"] - event["arrival"] >= 0.149
    assert event["max_tbt_s"] >= 0.039
    check_against_log(event, app.state.log["chat-1"])


def test_a_streamed_completion_without_usage_counts_chunks(captured: Recorder):
    app = make_app()
    mw = VigilMiddleware(app, model="served-name", replica="pod-3")
    asyncio.run(post(mw, "/v1/completions", {"rid": "cmpl-1", "tokens": 9, "gap": 0.01}))
    event = by_id(captured.requests())["cmpl-1"]
    assert event["output_tokens"] == 9 and "prompt_tokens" not in event
    assert (event["model"], event["replica"]) == ("served-name", "pod-3")
    check_against_log(event, app.state.log["cmpl-1"])


def test_a_non_streamed_reply_is_delivered_at_once(captured: Recorder):
    app = make_app()
    body = {"rid": "chat-2", "tokens": 12, "ttft": 0.1, "gap": 0.005}
    reply = asyncio.run(post(VigilMiddleware(app), "/v1/chat/completions", body))
    assert reply.json()["usage"]["completion_tokens"] == 12
    event = by_id(captured.requests())["chat-2"]
    assert event["first_token"] == event["end"]
    assert 0.159 <= event["end"] - event["arrival"] < 0.16 + 0.5  # the app's sleep, loosely
    assert event["output_tokens"] == 12 and event["prompt_tokens"] == PROMPT_TOKENS
    assert "token_times" not in event


@pytest.mark.parametrize(
    ("code", "status"), [(429, "rejected"), (503, "rejected"), (500, "error"), (400, "error")]
)
def test_http_status_maps_to_request_status(captured: Recorder, code: int, status: str):
    body = {"rid": f"s-{code}", "status": code}
    reply = asyncio.run(post(VigilMiddleware(make_app()), "/v1/chat/completions", body))
    assert reply.status_code == code
    (event,) = captured.requests()
    assert event["status"] == status and event["output_tokens"] == 0


def test_an_app_failing_mid_stream_is_an_error_and_its_exception_propagates(
    captured: Recorder,
):
    app = VigilMiddleware(make_app())
    body = {"rid": "chat-3", "stream": True, "tokens": 5, "gap": 0.01, "fail_at": 3}
    with pytest.raises(RuntimeError, match="engine died"):
        asyncio.run(post(app, "/v1/chat/completions", body))
    (event,) = captured.requests()
    assert event["status"] == "error" and event["output_tokens"] == 3


def test_other_methods_and_paths_are_not_timed(captured: Recorder):
    app = VigilMiddleware(make_app())

    async def calls() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            assert (await client.get("/v1/chat/completions")).json() == {"ok": True}
            assert (await client.post("/v1/embeddings", json={})).json() == {"data": []}

    asyncio.run(calls())
    assert captured.requests() == []


def test_added_the_way_vllm_adds_it(captured: Recorder):
    """``vllm serve --middleware collector.integrations.asgi.VigilMiddleware`` imports the
    class and calls ``app.add_middleware(cls)``, with no arguments."""
    app = make_app()
    app.add_middleware(VigilMiddleware)
    body = {"rid": "chat-4", "stream": True, "tokens": 3, "usage": True}
    asyncio.run(post(app, "/v1/chat/completions", body))
    event = by_id(captured.requests())["chat-4"]
    assert event["output_tokens"] == 3 and event["model"] == MODEL


# -- raw ASGI: disconnects and malformed streams ----------------------------------------------


async def drive(
    app: Any, *, disconnect_after: int | None = None, spec: str = "2.3", body: bytes = b"{}"
) -> list[dict[str, Any]]:
    """One POST through ``app``; the client disconnects after ``disconnect_after`` body
    messages. Returns what the server was asked to send."""
    sent: list[dict[str, Any]] = []
    gone = asyncio.Event()
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        bodies = sum(m["type"] == "http.response.body" for m in sent)
        if disconnect_after is not None and bodies >= disconnect_after:
            gone.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": spec},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    await app(scope, receive, send)
    return sent


def test_a_client_that_goes_away_is_an_abort(captured: Recorder):
    body = compact({"rid": "chat-5", "stream": True, "tokens": 50, "gap": 0.01}).encode()
    sent = asyncio.run(drive(VigilMiddleware(make_app()), disconnect_after=4, body=body))
    assert len(sent) < 20  # the app stopped streaming
    (event,) = captured.requests()
    assert event["status"] == "aborted_by_client"
    assert event["output_tokens"] == 3  # role chunk, then three tokens


def test_malformed_and_split_streams_pass_through_untouched(captured: Recorder):
    token = b'data: {"id":"odd-1","model":"m","choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
    long_line = b"data: " + b"y" * (asgi.MAX_LINE + 10) + b"\n\n"
    pieces = [
        b": a comment\n\nevent: ping\ndata: not json\n\n",
        token[:30],  # an event split across messages
        token[30:] + token + token,  # and several in one message
        b"data: \xff\xfe{broken\n\n",
        long_line[:700_000],
        long_line[700_000:],  # an over-long line is skipped, the stream is not
        b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"id":"c"}]}},'
        b'{"index":1,"text":"z"}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"content":""}}]}\n\n',
        b"data: [DONE]\n\n",
    ]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for piece in pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    sent = asyncio.run(drive(VigilMiddleware(app), spec="2.4"))
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body"]
    assert bodies == [*pieces, b""]
    (event,) = captured.requests()
    assert event["id"] == "odd-1" and event["model"] == "m" and event["status"] == "ok"
    assert event["output_tokens"] == 5  # 3 content chunks, then a tool call and a text


CHUNKS = {
    "vllm chat token": (chat_chunk("c", {"content": " hi"}), 1),
    "vllm chat role": (chat_chunk("c", {"role": "assistant", "content": ""}), 0),
    "vllm chat finish": (chat_chunk("c", {}, finish="stop"), 0),
    "empty content at the end": (chat_chunk("c", {"content": ""}, finish="length"), 0),
    "reasoning": (chat_chunk("c", {"reasoning_content": "hmm"}), 1),
    "tool call": (chat_chunk("c", {"tool_calls": [{"index": 0, "id": "t"}]}), 1),
    "content and reasoning": (chat_chunk("c", {"content": "a", "reasoning_content": "b"}), 1),
    "usage only": ({"id": "c", "choices": [], "usage": {"completion_tokens": 3}}, 0),
    "two choices": (
        {
            "choices": [
                {"index": 0, "delta": {"content": "a"}},
                {"index": 1, "delta": {"content": "b"}},
            ]
        },
        2,
    ),
    "logprobs with a content key": (
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": '"delta":{"content":"'},
                    "logprobs": {"content": [{"token": "text", "logprob": -0.1}]},
                }
            ]
        },
        1,
    ),
    "completion text": ({"choices": [{"index": 0, "text": " w", "logprobs": None}]}, 1),
    "completion empty text": ({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}, 0),
    "top logprobs keyed by token": (
        {"choices": [{"index": 0, "text": "a", "logprobs": {"top_logprobs": [{"text": -1}]}}]},
        1,
    ),
}


@pytest.mark.parametrize("name", sorted(CHUNKS))
@pytest.mark.parametrize("spaced", [False, True])
def test_the_quick_token_count_agrees_with_parsing(captured: Recorder, name: str, spaced: bool):
    chunk, tokens = CHUNKS[name]
    payload = (json.dumps(chunk) if spaced else compact(chunk)).encode()
    ex = asgi._Exchange(Request())
    assert ex._payload(payload) == asgi._tokens_in(payload) == tokens


def test_a_failure_inside_the_middleware_never_breaks_the_response(
    captured: Recorder,
    monkeypatch: pytest.MonkeyPatch,
):
    def broken(self: Any, p: bytes) -> int:
        raise RuntimeError("vigil bug")

    monkeypatch.setattr(asgi._Exchange, "_payload", broken)
    body = {"rid": "chat-6", "stream": True, "tokens": 4, "gap": 0.0}
    reply = asyncio.run(post(VigilMiddleware(make_app()), "/v1/chat/completions", body))
    assert reply.status_code == 200 and reply.text.count("data:") == 7
    (event,) = captured.requests()
    assert event["status"] == "ok"  # the request is still recorded, without tokens


# -- end to end: uvicorn, a real client, a real vigil server -----------------------------------


@pytest.fixture
def uvicorn_app(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FastAPI, str]]:
    app = make_app()
    app.add_middleware(VigilMiddleware)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield app, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def serve_traffic(url: str) -> None:
    """Three requests as clients send them: a streamed chat with usage, a non-streamed
    one, and a stream the client hangs up on."""
    with httpx.Client(base_url=url, timeout=30) as http:
        body = {"rid": "e2e-1", "stream": True, "tokens": 8, "ttft": 0.2, "gap": 0.05}
        with http.stream("POST", "/v1/chat/completions", json={**body, "usage": True}) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data:")]
        assert len(lines) == 12  # role, 8 tokens, finish, usage, [DONE]
        body = {"rid": "e2e-2", "tokens": 5, "ttft": 0.05, "gap": 0.01}
        assert http.post("/v1/chat/completions", json=body).status_code == 200
        body = {"rid": "e2e-3", "stream": True, "tokens": 200, "gap": 0.02}
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            for n, _ in enumerate(r.iter_lines()):
                if n >= 6:
                    break  # the client hangs up mid-stream


def check_traffic(stored: dict[str, dict[str, Any]], log: dict[str, Any]) -> None:
    """``stored``: request id → the request's fields, with ``token_times`` as sent."""
    first, record = stored["e2e-1"], log["e2e-1"]
    assert first["status"] == "ok" and first["model"] == MODEL and first["replica"] == "pod-7"
    assert (first["output_tokens"], first["prompt_tokens"]) == (8, PROMPT_TOKENS)
    assert first["first_token"] - first["arrival"] >= 0.199
    assert first["max_tbt_s"] >= 0.049
    assert first["token_times"]["stride"] == 1
    check_against_log(first, record)
    second = stored["e2e-2"]
    assert second["first_token"] == second["end"] and second["output_tokens"] == 5
    third = stored["e2e-3"]
    assert third["status"] == "aborted_by_client"
    assert 1 <= third["output_tokens"] < 200


def vigil_env(monkeypatch: pytest.MonkeyPatch, endpoint: str, job: str) -> None:
    """What ``VIGIL_ENDPOINT=… VIGIL_JOB=… vllm serve … --middleware …`` sets up: the
    middleware starts the collector itself on the first request."""
    env = {
        "VIGIL_ENDPOINT": endpoint,
        "VIGIL_JOB": job,
        "VIGIL_TOKEN": "vigil-dev-ingest",
        "VIGIL_REPLICA": "pod-7",
        "VIGIL_FLUSH_S": "0.1",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert collector.get_client() is None


def test_end_to_end_through_uvicorn(
    monkeypatch: pytest.MonkeyPatch, uvicorn_app: tuple[FastAPI, str]
):
    """A real HTTP client and server; the collector ships over HTTP to a receiver that
    keeps the batches."""
    app, url = uvicorn_app
    with Receiver() as rx:
        vigil_env(monkeypatch, rx.url(), "serving-e2e")
        serve_traffic(url)
        client = collector.get_client()
        assert client is not None and client.config.kind == "serving"
        assert client.config.job == "serving-e2e"
        # The server learns of the hang-up when its next chunk fails to go out.
        deadline = time.monotonic() + 15
        while len(events := requests_received(rx)) < 3:
            assert time.monotonic() < deadline, f"received only {events}"
            collector.flush(2)
            time.sleep(0.05)
        batches = [_batch(r) for r in rx.received("/api/v1/ingest")]
    assert {b["kind"] for b in batches} == {"serving"}
    check_traffic(by_id(events), app.state.log)


@pytest.mark.skipif(
    importlib.util.find_spec("detectors.serving") is None,
    reason="the backend cannot store request events yet (detectors.serving is missing)",
)
def test_end_to_end_with_a_vigil_server(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch, uvicorn_app: tuple[FastAPI, str]
):
    """As above, shipping to a real ``vigil server``; what it stored is read back."""
    app, url = uvicorn_app
    with live_server(sqlite_url) as base:
        vigil_env(monkeypatch, base, "serving-e2e")
        serve_traffic(url)
        deadline = time.monotonic() + 15
        while len(stored := stored_requests(sqlite_url)) < 3:
            assert time.monotonic() < deadline, f"stored only {sorted(stored)}"
            collector.flush(2)
            time.sleep(0.1)
    check_traffic(stored, app.state.log)


def stored_requests(sqlite_url: str) -> dict[str, dict[str, Any]]:
    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as db:
        db.row_factory = sqlite3.Row
        rows = [dict(r) for r in db.execute("SELECT * FROM requests")]
    for row in rows:
        if row["token_deltas"] is not None:
            data = base64.b64encode(row["token_deltas"]).decode()
            row["token_times"] = {"enc": "dv1", "stride": row["token_stride"], "data": data}
    return {row["request_id"]: row for row in rows}


def requests_received(rx: Receiver) -> list[dict[str, Any]]:
    batches = [_batch(r) for r in rx.received("/api/v1/ingest")]
    return [e for b in batches for e in b["events"] if e["type"] == "request"]


def _batch(received: dict[str, Any]) -> dict[str, Any]:
    body = received["body"]
    assert isinstance(body, bytes)
    headers = received["headers"]
    assert isinstance(headers, dict)
    if headers.get("content-encoding") == "gzip":
        body = gzip.decompress(body)
    return dict(json.loads(body))

"""The example model server over HTTP: OpenAI's streaming format, exact output lengths,
continuous batching of concurrent requests, and the chaos knobs."""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import statistics
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from examples.serving.chaos import ChaosSpecError, parse
from examples.serving.model_server import ServerConfig
from tests.examples.model_servers import model_server_process, served
from tests.servers import Receiver


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with served(ServerConfig(max_batch=16)) as url:
        yield url


def sse(url: str, path: str, body: dict[str, Any]) -> tuple[list[Any], list[float]]:
    """The ``data:`` payloads of a streamed response (JSON decoded, ``[DONE]`` as is) and
    when each arrived."""
    payloads, times = [], []
    with httpx.stream("POST", url + path, json=body, timeout=30) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[6:]
                payloads.append(data if data == "[DONE]" else json.loads(data))
                times.append(time.perf_counter())
    return payloads, times


def test_a_streamed_completion_has_exactly_max_tokens_tokens(base: str):
    body = {
        "model": "tiny-llm",
        "prompt": "the quick brown fox",
        "max_tokens": 37,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks, _ = sse(base, "/v1/completions", body)
    assert chunks[-1] == "[DONE]"
    *tokens, finish, usage, _ = chunks
    assert len(tokens) == 37
    for c in tokens:
        assert c["object"] == "text_completion" and c["model"] == "tiny-llm"
        (choice,) = c["choices"]
        assert choice["index"] == 0 and choice["text"].strip() and choice["finish_reason"] is None
    assert len({c["id"] for c in chunks[:-1]}) == 1
    assert finish["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 4, "completion_tokens": 37, "total_tokens": 41}


def test_a_streamed_chat_completion(base: str):
    body = {
        "messages": [{"role": "user", "content": "say something"}],
        "max_tokens": 5,
        "ignore_eos": True,
        "stream": True,
    }
    chunks, _ = sse(base, "/v1/chat/completions", body)
    role, *tokens, finish, done = chunks
    assert done == "[DONE]"
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [set(c["choices"][0]["delta"]) for c in tokens] == [{"content"}] * 5
    assert finish["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "length",
    }
    assert "usage" not in finish  # not asked for


def test_prompts_as_text_token_ids_or_a_count(base: str):
    def usage(body: dict[str, Any], path: str = "/v1/completions") -> dict[str, int]:
        reply = httpx.post(base + path, json={"max_tokens": 3, "ignore_eos": True, **body})
        assert reply.status_code == 200, reply.text
        return dict(reply.json()["usage"])

    assert usage({"prompt": "one two three"})["prompt_tokens"] == 3
    assert usage({"prompt": [1, 2, 3, 4, 5]})["prompt_tokens"] == 5
    assert usage({"prompt_tokens": 1500})["prompt_tokens"] == 1500  # prefilled in chunks
    chat = {"messages": [{"role": "user", "content": "hi"}], "prompt_tokens": 42}
    assert usage(chat, "/v1/chat/completions") == {
        "prompt_tokens": 42,
        "completion_tokens": 3,
        "total_tokens": 45,
    }
    reply = httpx.post(
        base + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "ignore_eos": True},
    ).json()
    assert reply["object"] == "chat.completion"
    assert len(reply["choices"][0]["message"]["content"].split()) == 4


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "x", "n": 2},
        {"prompt": "x", "max_tokens": 0},
        {"prompt": [1, 99999]},
        {"prompt": "x", "stream": "sometimes"},
    ],
)
def test_bad_requests_get_openai_errors(base: str, body: dict[str, Any]):
    reply = httpx.post(base + "/v1/completions", json=body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["code"] == 400 and error["message"]


def test_concurrent_requests_are_batched(base: str):
    """Eight streams at once take far less than eight times one stream: they share decode
    steps (the server counts them)."""
    body = {"prompt": "go", "max_tokens": 120, "ignore_eos": True, "stream": True}

    async def streams(n: int) -> float:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:

            async def one() -> int:
                async with http.stream("POST", "/v1/completions", json=body) as r:
                    return sum([line.startswith("data: {") async for line in r.aiter_lines()])

            started = time.perf_counter()
            counts = await asyncio.gather(*(one() for _ in range(n)))
            assert counts == [121] * n  # tokens + the finish chunk
            return time.perf_counter() - started

    single = min(asyncio.run(streams(1)) for _ in range(3))  # best of: a busy CI machine
    before = httpx.get(base + "/health").json()
    eight = min(asyncio.run(streams(8)) for _ in range(2))
    after = httpx.get(base + "/health").json()
    steps = after["steps"] - before["steps"]
    assert after["tokens"] - before["tokens"] == 2 * 8 * 120
    assert steps < 0.3 * 2 * 8 * 120, steps  # ~2 × 120 when all eight are in every step
    assert after["max_batch_seen"] >= 8
    assert eight < 0.6 * 8 * single, (eight, single)


def test_a_client_that_hangs_up_frees_its_slot(base: str):
    body = {"prompt": "go", "max_tokens": 30_000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=30) as r:
        for n, _ in enumerate(r.iter_lines()):
            if n > 10:
                break
    deadline = time.monotonic() + 10
    while httpx.get(base + "/health").json()["running"]:
        assert time.monotonic() < deadline, "the abandoned request kept its slot"
        time.sleep(0.05)


# -- chaos --------------------------------------------------------------------------------


def test_errors_chaos_answers_500():
    with served(ServerConfig(chaos="errors:rate=0.5,seed=3")) as url:
        codes = [
            httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code
            for _ in range(40)
        ]
    assert set(codes) == {200, 500}
    assert 8 <= codes.count(500) <= 32


def test_shed_chaos_answers_429_beyond_max_waiting():
    chaos = "shed:max_waiting=1"
    with served(ServerConfig(max_batch=1, chaos=chaos)) as url, httpx.Client(timeout=30) as http:
        long = {"prompt": "x", "max_tokens": 20_000, "ignore_eos": True, "stream": True}
        with http.stream("POST", url + "/v1/completions", json=long) as running:
            lines = running.iter_lines()  # kept: dropping it would close the connection
            next(lines)  # it holds the only slot
            with http.stream("POST", url + "/v1/completions", json=long) as waiting:
                assert waiting.status_code == 200  # accepted: it waits for the slot
                deadline = time.monotonic() + 10
                while http.get(url + "/health").json()["waiting"] < 1:
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
                shed = http.post(url + "/v1/completions", json={"prompt": "x"})
        assert shed.status_code == 429
        assert shed.headers["retry-after"] == "1"
        assert shed.json()["error"]["code"] == 429


def test_slow_and_stall_chaos_slow_the_stream():
    body = {"prompt": "go", "max_tokens": 60, "ignore_eos": True, "stream": True}

    def gaps(url: str) -> float:
        _, times = sse(url, "/v1/completions", body)
        return statistics.median(b - a for a, b in itertools.pairwise(times[1:-2]))

    with served() as url:
        sse(url, "/v1/completions", body)  # warm up
        normal = gaps(url)
    with served(ServerConfig(chaos="slow:factor=8")) as url:
        sse(url, "/v1/completions", body)
        slow = gaps(url)
    assert slow > 3 * normal, (slow, normal)

    with served(ServerConfig(chaos="stall:at_s=0,for_s=1.5")) as url:
        started = time.perf_counter()
        _, times = sse(url, "/v1/completions", {**body, "max_tokens": 3})
    assert times[0] - started > 0.7  # nothing came out until the stall was over


def test_chaos_specs_are_checked():
    (slow, shed) = parse("slow:factor=3,after_s=20; shed:max_waiting=8")
    assert (slow.kind, slow.after_s, slow.params) == ("slow", 20.0, {"factor": 3.0})
    assert shed.active(0.0) and shed.active(1e9)
    (stall,) = parse("stall:at_s=30,for_s=5")
    assert not stall.active(29.9) and stall.active(30) and not stall.active(35)
    for bad in ("melt:x=1", "slow:speed=3", "errors:rate=lots", "stall:at_s=3"):
        with pytest.raises(ChaosSpecError):
            parse(bad)


def test_runs_as_a_program_and_reports_its_requests_to_vigil():
    """Started as users start it, with chaos from the environment and VIGIL_ENDPOINT set:
    the collector's ASGI middleware reports every request, failed ones included."""
    with Receiver() as rx:
        env = {
            "VIGIL_SERVE_CHAOS": "errors:rate=0.5,seed=1",
            "VIGIL_ENDPOINT": rx.url(),
            "VIGIL_TOKEN": "vigil-dev-ingest",
            "VIGIL_FLUSH_S": "0.1",
        }
        with model_server_process("--replica", "r7", "--job", "tiny-chat", **env) as url:
            health = httpx.get(url + "/health").json()
            assert (health["replica"], health["model"]) == ("r7", "tiny-llm")
            codes = []
            while len(set(codes)) < 2:
                body = {"prompt": "x", "max_tokens": 4, "ignore_eos": True, "stream": True}
                with httpx.stream("POST", url + "/v1/completions", json=body) as r:
                    r.read()
                    codes.append(r.status_code)
                assert len(codes) < 30
            assert set(codes) == {200, 500}
            deadline = time.monotonic() + 15
            while len(events := request_events(rx)) < len(codes):
                assert time.monotonic() < deadline, events
                time.sleep(0.05)
    assert {e["replica"] for e in events} == {"r7"}
    assert {e["model"] for e in events} == {"tiny-llm"}
    ok = [e for e in events if e["status"] == "ok"]
    assert len(ok) == codes.count(200) and {e["output_tokens"] for e in ok} == {4}
    assert sum(e["status"] == "error" for e in events) == codes.count(500)


def request_events(rx: Receiver) -> list[dict[str, Any]]:
    events = []
    for received in rx.received("/api/v1/ingest"):
        body = received["body"]
        assert isinstance(body, bytes)
        batch = json.loads(gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body)
        assert (batch["job"], batch["kind"]) == ("tiny-chat", "serving")
        events += [e for e in batch["events"] if e["type"] == "request"]
    return events

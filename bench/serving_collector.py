"""What ``vigil.serving.Request`` and the ASGI middleware cost a server's event loop.

Timeit-style: each figure is the median over ``--repeats`` runs of a loop, divided by the
loop's length. The collector is live (a real ``Client`` and its shipping thread) but ships
to a transport that accepts every batch without I/O, so the shipping thread's JSON work
still competes for the GIL as it would in a server. Targets: ≤ 20 µs per request, ≤ 1 µs
per token.

- ``request, no tokens``: ``Request()`` then ``end()``: the per-request floor.
- ``token()``: one call on a request that streams 100,000 tokens (folding and sampling
  included).
- ``end() with N tokens``: ``end()`` alone, after N ``token()`` calls (building the event:
  gaps, sampling, encoding), and that per token.
- ``request with 256 tokens``: the whole life of a typical request.
- ``no-op``: the same calls before ``init()``.
- ``middleware, per chunk``: an ASGI app streaming vLLM-style chat chunks through
  ``VigilMiddleware`` to a ``send`` that does nothing, minus the same app without it.
- ``shipping CPU per request``: process CPU time per 256-token request, everything
  included (the shipping thread's JSON and gzip too).

    python bench/serving_collector.py
    python bench/serving_collector.py --repeats 9 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import collector  # noqa: E402
from collector.client import Client  # noqa: E402
from collector.config import Config  # noqa: E402
from collector.integrations.asgi import VigilMiddleware  # noqa: E402
from collector.serving import Request  # noqa: E402
from collector.transport import Outcome  # noqa: E402


class NullTransport:
    """Accepts every batch after serialising it, as the HTTP transport would."""

    def __init__(self) -> None:
        self.events = 0

    def send(self, batch: dict[str, Any]) -> Outcome:
        json.dumps(batch, separators=(",", ":"))
        self.events += len(batch["events"])
        return Outcome(True)


def live_client() -> Client:
    config = Config.resolve(
        job="bench-serving", endpoint="http://127.0.0.1:9", kind="serving", max_queue=1_000_000
    )
    client = Client(config, transport=NullTransport())  # type: ignore[arg-type]
    collector._client = client
    return client


def median_per_op(run: Callable[[], float], repeats: int) -> float:
    """``run`` returns seconds per operation for one repeat; the median, in µs."""
    return statistics.median(run() for _ in range(repeats)) * 1e6


def per_request(loops: int) -> Callable[[], float]:
    def run() -> float:
        started = time.perf_counter()
        for _ in range(loops):
            Request().end()
        elapsed = time.perf_counter() - started
        collector.flush(10)
        return elapsed / loops

    return run


def per_token(tokens: int) -> Callable[[], float]:
    def run() -> float:
        r = Request()
        token = r.token
        started = time.perf_counter()
        for _ in range(tokens):
            token()
        elapsed = time.perf_counter() - started
        r.end()
        return elapsed / tokens

    return run


def end_with(tokens: int, loops: int) -> Callable[[], float]:
    def run() -> float:
        reqs = []
        for _ in range(loops):
            r = Request()
            for _ in range(tokens):
                r.token()
            reqs.append(r)
        started = time.perf_counter()
        for r in reqs:
            r.end()
        elapsed = time.perf_counter() - started
        collector.flush(30)
        return elapsed / loops

    return run


def whole_request(tokens: int, loops: int) -> Callable[[], float]:
    def run() -> float:
        started = time.perf_counter()
        for _ in range(loops):
            r = Request(prompt_tokens=512, model="bench")
            for _ in range(tokens):
                r.token()
            r.end()
        elapsed = time.perf_counter() - started
        collector.flush(30)
        return elapsed / loops

    return run


def noop(loops: int) -> Callable[[], float]:
    def run() -> float:
        started = time.perf_counter()
        for _ in range(loops):
            r = Request()
            r.token()
            r.end()
        return (time.perf_counter() - started) / loops

    return run


CHUNK = (
    b'data: {"id":"chatcmpl-7c3b5e1f2a","object":"chat.completion.chunk","created":1732233000,'
    b'"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":'
    b'" world"},"logprobs":null,"finish_reason":null}]}\n\n'
)


def middleware_chunk(chunks: int, wrapped: bool) -> Callable[[], float]:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        message = {"type": "http.response.body", "body": CHUNK, "more_body": True}
        for _ in range(chunks):
            await send(message)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        pass

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    target = VigilMiddleware(app, model="bench") if wrapped else app

    def run() -> float:
        loop = asyncio.new_event_loop()
        try:
            started = time.perf_counter()
            loop.run_until_complete(target(scope, receive, send))
            elapsed = time.perf_counter() - started
        finally:
            loop.close()
        collector.flush(10)
        return elapsed / chunks

    return run


def shipping_cpu(tokens: int, loops: int) -> float:
    """Process CPU seconds per request, shipping thread included."""
    collector.flush(30)
    started = time.process_time()
    whole_request(tokens, loops)()
    collector.flush(30)
    return (time.process_time() - started) / loops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="also print one JSON line")
    args = parser.parse_args()
    reps = args.repeats

    results: dict[str, float] = {}
    collector._client = None
    results["no-op request (create, token, end)"] = median_per_op(noop(100_000), reps)

    client = live_client()
    try:
        results["request, no tokens (create + end)"] = median_per_op(per_request(20_000), reps)
        results["token()"] = median_per_op(per_token(100_000), reps)
        for n, loops in ((16, 2000), (256, 500), (1024, 200), (4096, 50), (100_000, 3)):
            us = median_per_op(end_with(n, loops), reps)
            results[f"end() with {n} tokens"] = us
            results[f"end() with {n} tokens, per token"] = us / n
        results["request with 256 tokens (whole life)"] = median_per_op(
            whole_request(256, 500), reps
        )
        base = median_per_op(middleware_chunk(5000, wrapped=False), reps)
        wrapped = median_per_op(middleware_chunk(5000, wrapped=True), reps)
        results["middleware, per chunk (added)"] = wrapped - base
        results["shipping CPU per 256-token request (all threads)"] = (
            statistics.median(shipping_cpu(256, 500) for _ in range(reps)) * 1e6
        )
        dropped = dict(client.worker.dropped)
    finally:
        client.shutdown(5)
        collector._client = None

    width = max(map(len, results))
    print(f"serving collector costs, µs (median of {reps}; Python {sys.version.split()[0]})")
    for name, us in results.items():
        print(f"  {name:<{width}}  {us:9.3f}")
    if dropped:
        print(f"  dropped: {dropped}")
    if args.json:
        print(json.dumps({"us": results, "dropped": dropped}))


if __name__ == "__main__":
    main()

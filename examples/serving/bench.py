"""Throughput of the example model server: N concurrent streams of ``--tokens`` tokens each.

    python -m examples.serving.model_server --port 8100 &
    python -m examples.serving.bench --url http://127.0.0.1:8100 --concurrency 1 16

Prints, per concurrency, output tokens per second (all streams together, as the clients
received them), the mean time per output token of one stream, and the server's mean batch.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx


async def one(http: httpx.AsyncClient, url: str, tokens: int, prompt: int) -> int:
    body = {
        "prompt_tokens": prompt,
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
    }
    n = 0
    async with http.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                n += 1
    return n - 1  # the finish chunk


async def measure(url: str, concurrency: int, tokens: int, prompt: int) -> tuple[float, float]:
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=256)) as http:
        await one(http, url, 4, prompt)  # warm up
        before = (await http.get(url + "/health")).json()
        started = time.perf_counter()
        counts = await asyncio.gather(*(one(http, url, tokens, prompt) for _ in range(concurrency)))
        took = time.perf_counter() - started
        after = (await http.get(url + "/health")).json()
    steps = after["steps"] - before["steps"]
    batch = (after["tokens"] - before["tokens"]) / steps if steps else 0.0
    return sum(counts) / took, batch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8100")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--prompt", type=int, default=64)
    args = p.parse_args()
    for c in args.concurrency:
        rate, batch = asyncio.run(measure(args.url, c, args.tokens, args.prompt))
        print(
            f"concurrency {c:3d}: {rate:8.0f} output tokens/s, "
            f"{1000 * c / rate:6.2f} ms per token per stream, mean batch {batch:.1f}"
        )


if __name__ == "__main__":
    main()

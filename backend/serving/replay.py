"""``vigil replay``: send a serving trace's requests to an OpenAI-compatible server at their
real arrival times, and report what the client saw to Vigil.

    trace = read_trace(Path("conversation_trace.jsonl"), limit=500)
    run = Replay(trace.requests, ReplayOptions(target="http://127.0.0.1:8100", speedup=4))
    asyncio.run(run.play())
    summarize(run.outcomes)          # TTFT, TPOT, throughput (backend.serving.report)

Open loop: request i is sent at ``arrival_s / speedup`` after the start whether or not the
earlier ones have finished, as real users do; ``concurrency_cap`` bounds the requests in
flight (one that finds the cap reached waits, and the wait is reported as send lag).
Every request asks for the trace's output length exactly (``max_tokens``, ``ignore_eos``),
streamed, with ``stream_options.include_usage``. The prompt has the trace's token count:

- ``count``: sent as ``"prompt_tokens": N``, an extension of Vigil's example server
  (``examples/serving/model_server.py``), which then synthesises a prompt of exactly N tokens;
- ``words``: N repetitions of ``hi``. With the BPE tokenizers of common models (GPT, Llama,
  Qwen) that is N tokens (``" hi"`` is one token), plus the chat template's few tokens for
  the chat API. A fair approximation: prefill time depends on the count, not the text
  (prefix caching aside: the prompts of a replay share their prefixes, real ones mostly not).
- ``auto`` (default): ``count`` when the target's ``/v1/models`` says ``owned_by:
  "vigil-example"``, else ``words``.

Time to first token is measured from the moment the request is sent to the first SSE chunk
that carries text; every later chunk is one token's arrival. The records go to Vigil through
the collector (:func:`open_record`), one ``request`` event per request, ids ``<prefix>-<i>``
(also sent as ``X-Request-Id``, so the server's own records can be matched to them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

import httpx

import collector as vigil
from backend.serving.traces import TraceRequest

PromptMode = Literal["auto", "count", "words"]
Api = Literal["completions", "chat"]
PROMPT_WORD = "hi"


class ReplayError(RuntimeError):
    """The replay cannot start (target unreachable, model unknown, …)."""


class Record(Protocol):
    """What the replay tells the collector about one request, as it happens."""

    def first_token(self, n: int = 1) -> None: ...
    def token(self, n: int = 1) -> None: ...
    def end(self, status: str = "ok", output_tokens: int | None = None) -> None: ...


def open_record(request_id: str, prompt_tokens: int, model: str | None) -> Record:
    """The collector's timer for one request, started now (the moment it is sent).

    The one place the replay meets the collector: a no-op before ``vigil.init()``."""
    return vigil.serving.Request(id=request_id, prompt_tokens=prompt_tokens, model=model)


@dataclass(frozen=True)
class ReplayOptions:
    target: str  # base URL (http://host:port) or the full /v1/... endpoint URL
    speedup: float = 1.0
    concurrency_cap: int = 512
    model: str | None = None  # default: the first model the target lists
    api: Api = "completions"
    prompt_mode: PromptMode = "auto"
    timeout_s: float = 600.0
    id_prefix: str = field(default_factory=lambda: f"replay-{os.urandom(3).hex()}")


@dataclass
class Outcome:
    """What the client saw of one request; times are seconds from the start of the replay."""

    index: int
    id: str
    prompt_tokens: int
    max_tokens: int
    due_s: float  # when the trace says it arrives (scaled)
    sent_s: float = 0.0
    end_s: float = 0.0
    token_s: array[float] = field(default_factory=lambda: array("d"))  # each text chunk
    output_tokens: int = 0  # usage.completion_tokens, else text chunks
    status: str = "error"  # ok, rejected (429/503), error, aborted_by_client
    http_status: int | None = None
    error: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return self.token_s[0] - self.sent_s if self.token_s else None

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first."""
        n = len(self.token_s)
        return (self.token_s[-1] - self.token_s[0]) / (n - 1) if n >= 2 else None

    @property
    def lag_s(self) -> float:
        return self.sent_s - self.due_s


def endpoint_url(target: str, api: Api) -> tuple[str, str, Api]:
    """(base URL, endpoint URL, api) for a target given as a base or as an endpoint."""
    target = target.rstrip("/")
    if urlsplit(target).scheme not in ("http", "https"):
        raise ReplayError(f"target {target!r} is not a URL (http://host:port)")
    for suffix, kind in (("/v1/chat/completions", "chat"), ("/v1/completions", "completions")):
        if target.endswith(suffix):
            return target[: -len(suffix)], target, kind  # type: ignore[return-value]
    base = target.removesuffix("/v1")
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    return base, base + path, api


class Replay:
    """One replay of ``requests`` against a target; ``outcomes`` fills as requests finish
    (so an interrupted replay still has what it measured)."""

    def __init__(
        self,
        requests: list[TraceRequest],
        options: ReplayOptions,
        *,
        on_update: Callable[[Replay], None] | None = None,
        record: Callable[[str, int, str | None], Record] = open_record,
    ) -> None:
        self.requests = requests
        self.options = options
        self.on_update = on_update
        self.record = record
        self.outcomes: list[Outcome] = []
        self.sent = 0
        self.in_flight = 0
        self.model: str | None = options.model
        self.prompt_mode: PromptMode = options.prompt_mode
        self.started = 0.0  # perf_counter at the start
        self.finished = 0.0
        self.base, self.url, self.api = endpoint_url(options.target, options.api)

    def now(self) -> float:
        return time.perf_counter() - self.started

    async def play(self, stop: asyncio.Event | None = None) -> list[Outcome]:
        """Send every request at its time and wait for them all; once ``stop`` is set, send
        no more (those in flight still finish)."""
        opts = self.options
        if opts.speedup <= 0:
            raise ReplayError("speedup must be positive")
        cap = max(1, opts.concurrency_cap)
        limits = httpx.Limits(max_connections=cap, max_keepalive_connections=cap)
        timeout = httpx.Timeout(opts.timeout_s, connect=10.0)
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as http:
            await self._discover(http)
            slots = asyncio.Semaphore(cap)
            tasks: list[asyncio.Task[None]] = []
            self.started = time.perf_counter()
            try:
                for req in self.requests:
                    due = req.arrival_s / opts.speedup
                    delay = due - self.now()
                    if delay > 0 and stop is None:
                        await asyncio.sleep(delay)
                    elif delay > 0 and stop is not None:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop.wait(), delay)
                    if stop is not None and stop.is_set():
                        break
                    await slots.acquire()
                    tasks.append(asyncio.create_task(self._one(http, req, due, slots)))
                await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                self.finished = self.now()
        return self.outcomes

    async def _discover(self, http: httpx.AsyncClient) -> None:
        """The model name and prompt mode, from the target's ``/v1/models``."""
        if self.model is not None and self.prompt_mode != "auto":
            return
        try:
            reply = await http.get(self.base + "/v1/models", timeout=10)
            cards = reply.json().get("data", []) if reply.status_code == 200 else []
        except (httpx.HTTPError, ValueError, AttributeError):
            cards = []
        if self.model is None:
            if not cards:
                raise ReplayError(f"{self.base}/v1/models lists no model: give --model")
            self.model = str(cards[0].get("id"))
        if self.prompt_mode == "auto":
            ours = any(c.get("owned_by") == "vigil-example" for c in cards)
            self.prompt_mode = "count" if ours else "words"

    def body(self, req: TraceRequest) -> dict[str, Any]:
        n = max(1, req.prompt_tokens)
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max(1, req.output_tokens),
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        text = "" if self.prompt_mode == "count" else " ".join([PROMPT_WORD] * n)
        if self.prompt_mode == "count":
            body["prompt_tokens"] = n
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        return body

    async def _one(
        self, http: httpx.AsyncClient, req: TraceRequest, due: float, slots: asyncio.Semaphore
    ) -> None:
        rid = f"{self.options.id_prefix}-{req.index}"
        out = Outcome(req.index, rid, req.prompt_tokens, max(1, req.output_tokens), due)
        body = self.body(req)
        self.sent += 1
        self.in_flight += 1
        out.sent_s = self.now()
        rec = self.record(rid, req.prompt_tokens, self.model)
        try:
            await self._stream(http, body, out, rec)
        except asyncio.CancelledError:
            out.status, out.error = "aborted_by_client", "replay stopped"
            raise
        except (httpx.HTTPError, OSError, ValueError) as exc:
            out.status, out.error = "error", f"{type(exc).__name__}: {exc}"
        finally:
            out.end_s = self.now()
            if not out.output_tokens:
                out.output_tokens = len(out.token_s)
            rec.end(status=out.status, output_tokens=out.output_tokens)
            self.in_flight -= 1
            slots.release()
            self.outcomes.append(out)
            if self.on_update is not None:
                self.on_update(self)

    async def _stream(
        self, http: httpx.AsyncClient, body: dict[str, Any], out: Outcome, rec: Record
    ) -> None:
        headers = {"X-Request-Id": out.id, "Accept": "text/event-stream"}
        async with http.stream("POST", self.url, json=body, headers=headers) as resp:
            out.http_status = resp.status_code
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                out.status = "rejected" if resp.status_code in (429, 503) else "error"
                out.error = f"HTTP {resp.status_code}: {text[:200]}"
                return
            done = False
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if not isinstance(chunk, dict):
                    continue
                if chunk.get("error"):
                    out.error = str(chunk["error"])[:200]
                    break
                usage = chunk.get("usage")
                if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
                    out.output_tokens = int(usage["completion_tokens"])
                if _has_text(chunk):
                    out.token_s.append(self.now())
                    if len(out.token_s) == 1:
                        rec.first_token()
                    else:
                        rec.token()
            if done and out.error is None:
                out.status = "ok"
            elif out.error is None:
                out.error = "the stream ended without [DONE]"


def _has_text(chunk: dict[str, Any]) -> bool:
    for choice in chunk.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if choice.get("text"):
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and (delta.get("content") or delta.get("reasoning_content")):
            return True
    return False


def ship_to(endpoint: str, token: str | None, job: str) -> bool:
    """Start the collector for the replay's records (``kind="serving"``)."""
    return bool(
        vigil.init(job=job, endpoint=endpoint, token=token, kind="serving", integrations=False)
    )


def finish_shipping(timeout_s: float = 15.0) -> bool:
    """Deliver what is buffered and stop the collector; True when all of it went out."""
    delivered = bool(vigil.flush(timeout_s))
    vigil.shutdown(timeout=2.0)
    return delivered

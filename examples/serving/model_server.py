"""A real (small) LLM server for Vigil's tests and demo: OpenAI-compatible, streaming,
continuously batched, with faults on demand. Runs on CPU; nothing is downloaded.

    python -m examples.serving.model_server --port 8100 --replica r0
    curl -N localhost:8100/v1/completions -H 'content-type: application/json' \\
        -d '{"prompt": "hello there", "max_tokens": 8, "stream": true}'

Endpoints: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (``stream`` true or
false; ``stream_options.include_usage``; ``max_tokens``; ``temperature``; ``ignore_eos``:
generate exactly ``max_tokens``), ``GET /v1/models``, ``GET /health`` (batch and queue
sizes), ``GET /debug/requests`` (the server's own timing of the last 10,000 requests, by
``X-Request-Id`` when the client sent one, to compare with what a client measured).

The prompt is text (one token per word, see :mod:`examples.serving.model`), a list of token
ids, or, Vigil's extension for trace replay, ``"prompt_tokens": N``: a synthetic prompt of
exactly N tokens (the text, if any, is then ignored). ``usage.prompt_tokens`` reports it.

The model (:mod:`examples.serving.model`) is a 2-layer GPT with random, seeded weights;
batching is in :mod:`examples.serving.engine`; faults (``--chaos`` or
``VIGIL_SERVE_CHAOS``) in :mod:`examples.serving.chaos`. With ``VIGIL_ENDPOINT`` set, the
server reports every request to Vigil through ``collector.integrations.asgi``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from examples.serving.chaos import Chaos, ChaosSpecError
from examples.serving.engine import Done, Engine, Event, Failed, Sequence, Token
from examples.serving.model import EOS, ModelConfig, TinyLM, Tokenizer
from examples.serving.protocol import (
    ChatRequest,
    Chunks,
    CompletionRequest,
    Kind,
    chat_text,
    error_body,
    reply,
)

log = logging.getLogger("examples.serving")

DEFAULT_MAX_TOKENS = {"completion": 16, "chat": 256}  # OpenAI's 16; chat: until EOS, capped


@dataclass(frozen=True)
class ServerConfig:
    model_name: str = "tiny-llm"
    replica: str = "r0"
    max_batch: int = 16
    prefill_budget: int = 256  # prompt tokens prefilled per engine iteration
    max_prompt_tokens: int = 131_072
    max_output_tokens: int = 32_768
    chaos: str = ""
    step_floor_s: float = 0.0  # pad each engine step to at least this (an accelerator's pace)
    model: ModelConfig = field(default_factory=ModelConfig)


def _error(code: int, message: str, kind: str, **headers: str) -> JSONResponse:
    return JSONResponse(error_body(message, kind, code), status_code=code, headers=headers)


def create_app(config: ServerConfig | None = None) -> FastAPI:
    """The ASGI app. The engine thread starts and stops with the app's lifespan."""
    cfg = config or ServerConfig()
    chaos = Chaos.from_spec(cfg.chaos)  # raises ChaosSpecError on a bad spec
    tokenizer = Tokenizer(cfg.model.vocab)
    model = TinyLM(cfg.model)
    state: dict[str, Any] = {}

    def deliver(events: list[tuple[Sequence, Event]]) -> None:  # engine thread
        with contextlib.suppress(RuntimeError):  # the loop is closed: shutting down
            state["loop"].call_soon_threadsafe(_dispatch, events)

    def _dispatch(events: list[tuple[Sequence, Event]]) -> None:  # event loop
        for seq, event in events:
            seq.sink.put_nowait(event)

    engine = Engine(
        model,
        max_batch=cfg.max_batch,
        prefill_budget=cfg.prefill_budget,
        deliver=deliver,
        chaos=chaos or None,
        step_floor_s=cfg.step_floor_s,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state["loop"] = asyncio.get_running_loop()
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    app = FastAPI(title="Vigil example model server", lifespan=lifespan)
    app.state.engine = engine
    app.state.chaos = chaos
    started = time.time()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return _error(400, f"{where}: {first.get('msg', 'invalid request')}", "invalid_request")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        s = engine.stats
        return {
            "status": "ok",
            "model": cfg.model_name,
            "replica": cfg.replica,
            "running": engine.running,
            "waiting": engine.waiting,
            "max_batch": cfg.max_batch,
            "steps": s.steps,
            "prefill_chunks": s.prefill_chunks,
            "tokens": s.tokens,
            "max_batch_seen": s.max_batch_seen,
            "finished": s.finished,
            "uptime_s": round(time.time() - started, 3),
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": cfg.model_name, "object": "model", "created": int(started)}
        return {"object": "list", "data": [{**card, "owned_by": "vigil-example"}]}

    @app.get("/debug/requests")
    async def debug_requests(limit: int = 10_000) -> list[dict[str, Any]]:
        done = list(engine.finished_log)[-limit:] if limit > 0 else []
        return [
            {
                "id": s.id,
                "prompt_tokens": s.prompt_tokens,
                "output_tokens": s.output,
                "finish_reason": s.finish or "cancelled",
                "arrival": s.arrival,
                "scheduled": s.scheduled,
                "first_token": s.first_token,
                "end": s.end,
            }
            for s in done
        ]

    def too_long(n: int) -> JSONResponse | None:
        if n <= cfg.max_prompt_tokens:
            return None
        msg = f"prompt: {n} tokens, this server takes at most {cfg.max_prompt_tokens}"
        return _error(400, msg, "invalid_request")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        if body.prompt_tokens is not None:
            if refused := too_long(body.prompt_tokens):
                return refused
            prompt = tokenizer.synthetic(body.prompt_tokens)
        elif isinstance(body.prompt, list):
            if any(not 0 <= t < cfg.model.vocab for t in body.prompt):
                return _error(400, f"prompt: token ids are 0…{cfg.model.vocab - 1}", "invalid")
            prompt = torch.tensor(body.prompt, dtype=torch.long)
        else:
            prompt = torch.tensor(tokenizer.encode(body.prompt or ""), dtype=torch.long)
        return await serve("completion", body, body.max_tokens, prompt, request)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Any:
        if body.prompt_tokens is not None:
            if refused := too_long(body.prompt_tokens):
                return refused
            prompt = tokenizer.synthetic(body.prompt_tokens)
        else:
            ids = tokenizer.encode(chat_text(body.messages))
            prompt = torch.tensor(ids, dtype=torch.long)
        max_tokens = body.max_completion_tokens or body.max_tokens
        return await serve("chat", body, max_tokens, prompt, request)

    async def serve(
        kind: Kind,
        body: CompletionRequest | ChatRequest,
        max_tokens: int | None,
        prompt: torch.Tensor,
        request: Request,
    ) -> Any:
        if prompt.shape[0] == 0:
            prompt = torch.tensor([EOS])  # an empty prompt starts from end-of-sequence
        if refused := too_long(prompt.shape[0]):
            return refused
        limit = max_tokens or DEFAULT_MAX_TOKENS[kind]
        if limit > cfg.max_output_tokens:
            msg = f"max_tokens: at most {cfg.max_output_tokens}"
            return _error(400, msg, "invalid_request")
        status = chaos.reject(engine.waiting) if chaos else None
        if status == 429:
            return _error(429, "server overloaded, try again", "rate_limit", **{"Retry-After": "1"})
        if status is not None:
            return _error(status, "injected failure (chaos)", "server_error")
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex[:16]
        seq = Sequence(
            id=rid,
            prompt=prompt,
            max_tokens=limit,
            ignore_eos=body.ignore_eos,
            temperature=body.temperature,
            sink=asyncio.Queue(),
        )
        engine.submit(seq)
        out_id = ("cmpl-" if kind == "completion" else "chatcmpl-") + rid
        chunks = Chunks(kind, out_id, body.model or cfg.model_name, int(time.time()))
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(
                stream(seq, chunks, usage),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return await collect(seq, chunks)

    async def stream(seq: Sequence, chunks: Chunks, usage: bool) -> AsyncIterator[str]:
        finished = False
        try:
            if chunks.kind == "chat":
                yield chunks.role()
            while not finished:
                events = [await seq.sink.get()]
                while not seq.sink.empty():  # a backlog goes out in one write
                    events.append(seq.sink.get_nowait())
                out = []
                for event in events:
                    if isinstance(event, Token):
                        out.append(chunks.token(tokenizer.piece(event.token)))
                    elif isinstance(event, Done):
                        out.append(chunks.finish(event.finish_reason))
                        if usage:
                            out.append(chunks.usage(seq.prompt_tokens, seq.output))
                        out.append(chunks.done)
                        finished = True
                    elif isinstance(event, Failed):
                        out += [chunks.error(event.message), chunks.done]
                        finished = True
                yield "".join(out)
        finally:
            seq.cancelled = not finished  # the client went away: free the slot

    async def collect(seq: Sequence, chunks: Chunks) -> Any:
        pieces = []
        try:
            while True:
                event = await seq.sink.get()
                if isinstance(event, Token):
                    pieces.append(tokenizer.piece(event.token))
                elif isinstance(event, Failed):
                    return _error(500, event.message, "server_error")
                elif isinstance(event, Done):
                    break
        except asyncio.CancelledError:
            seq.cancelled = True
            raise
        return reply(
            chunks.kind,
            rid=chunks.rid,
            model=chunks.model,
            created=chunks.created,
            text="".join(pieces).lstrip(),
            finish_reason=event.finish_reason,
            prompt_tokens=seq.prompt_tokens,
            completion_tokens=seq.output,
        )

    _instrument(app, cfg)
    return app


def _instrument(app: FastAPI, cfg: ServerConfig) -> None:
    """Report every request to Vigil, when the collector's ASGI middleware is there."""
    try:
        from collector.integrations.asgi import VigilMiddleware
    except ImportError:  # an older collector: serve without it
        log.info("collector.integrations.asgi is missing: requests are not reported")
        return
    app.add_middleware(VigilMiddleware, model=cfg.model_name, replica=cfg.replica)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--replica", default=os.environ.get("VIGIL_REPLICA", "r0"))
    p.add_argument("--model", default="tiny-llm", help="the model name it answers to")
    p.add_argument("--job", default=os.environ.get("VIGIL_JOB", "tiny-llm-serving"))
    p.add_argument("--max-batch", type=int, default=16, help="running batch cap; others wait")
    p.add_argument("--prefill-budget", type=int, default=256, help="prompt tokens per step")
    p.add_argument("--max-prompt-tokens", type=int, default=131_072)
    p.add_argument(
        "--chaos",
        default=os.environ.get("VIGIL_SERVE_CHAOS", ""),
        help="faults, e.g. 'slow:factor=3,after_s=20;shed:max_waiting=8' [VIGIL_SERVE_CHAOS]",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for the engine (default 1: the event loop needs a core too)",
    )
    p.add_argument(
        "--step-floor-s",
        type=float,
        default=0.0,
        help="pad each engine step to at least this many seconds, like an accelerator's decode "
        "step (latencies then stand above a busy host's scheduling noise)",
    )
    p.add_argument("--dim", type=int, default=ModelConfig.dim)
    p.add_argument("--layers", type=int, default=ModelConfig.layers)
    p.add_argument("--window", type=int, default=ModelConfig.window)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-level", default="warning")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    if os.environ.get("VIGIL_ENDPOINT"):
        import collector as vigil

        vigil.init(job=args.job, kind="serving", integrations=False)
    config = ServerConfig(
        model_name=args.model,
        replica=args.replica,
        max_batch=args.max_batch,
        prefill_budget=args.prefill_budget,
        max_prompt_tokens=args.max_prompt_tokens,
        chaos=args.chaos,
        step_floor_s=args.step_floor_s,
        model=ModelConfig(dim=args.dim, layers=args.layers, window=args.window, seed=args.seed),
    )
    try:
        app = create_app(config)
    except (ChaosSpecError, ValueError) as exc:
        raise SystemExit(f"model_server: {exc}") from None
    print(
        f"{config.model_name} ({config.replica}) on http://{args.host}:{args.port}"
        + (f", chaos: {args.chaos}" if args.chaos else ""),
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()

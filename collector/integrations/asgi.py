"""ASGI middleware that times OpenAI-compatible completion endpoints, one ``request``
event per call, from what goes over the wire.

    vllm serve MODEL --middleware collector.integrations.asgi.VigilMiddleware
    # with VIGIL_ENDPOINT, VIGIL_TOKEN, VIGIL_JOB (and optionally VIGIL_REPLICA) set

    app = VigilMiddleware(app, model="llama-8b", replica="pod-3")    # any ASGI app

For ``POST`` requests to ``paths`` it records: arrival when the request reaches the
middleware; for a streamed (``text/event-stream``) response, each SSE ``data:`` chunk that
carries output (a non-empty ``choices[].text``, or a ``choices[].delta`` with anything
besides ``role``) as one token at the moment it is sent, the first being the first token;
the end when the body ends. ``usage`` (the final chunk with ``stream_options.include_usage``,
or the body of a non-streamed response) gives ``prompt_tokens`` and ``output_tokens``. A
non-streamed response counts as delivered all at once: first token = end = when its body
ends. Status: ``rejected`` for HTTP 429 and 503, ``error`` for other 4xx/5xx or when the
app raises, ``aborted_by_client`` when the client disconnects first (``http.disconnect``)
or the task is cancelled. Without ``model`` the response's ``model`` field is used;
without ``replica``, ``VIGIL_REPLICA``, else the collector's host name.

It never changes what passes through: every message goes to the server unchanged and is
looked at after it was sent. Parsing is defensive (anything unexpected stops the parsing of
that response, never the response) and bounded (an SSE line longer than 1 MiB is skipped).
A typical token chunk costs a few substring searches; other chunks a ``json.loads``.

vLLM's ``--middleware`` option imports the named object and, for a class, calls
``app.add_middleware(cls)`` with no arguments, hence the keyword-only options and the
environment defaults. Created while the collector is not initialised and ``VIGIL_ENDPOINT``
is set, the middleware initialises it (``kind="serving"``, no training integrations).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

import collector as _facade
from collector.serving import Request, _NoopRequest

log = logging.getLogger("vigil.collector")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_PATHS = ("/v1/completions", "/v1/chat/completions")
MAX_LINE = 1 << 20  # bytes of one SSE line kept while it is incomplete
META_BYTES = 4096  # where the response's id and model are looked for
META_TRIES = 4  # payloads searched for them
OVERLAP = 256  # bytes kept between body chunks of a non-streamed response

_mono = time.monotonic
_CHAT_TOKEN = b'"delta":{"content":"'
_TEXT_TOKEN = b'"text":"'
_USAGE = b'"usage"'
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d{1,10})')
_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d{1,10})')
_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,128})"')
_MODEL = re.compile(rb'"model"\s*:\s*"([^"\\]{1,128})"')

_NONE, _SSE, _JSON = 0, 1, 2


class VigilMiddleware:
    """Wrap an ASGI app; see the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        model: str | None = None,
        replica: str | None = None,
        paths: Iterable[str] = DEFAULT_PATHS,
    ) -> None:
        self.app = app
        self.model = model
        self.replica = replica or os.environ.get("VIGIL_REPLICA") or None
        self.paths = frozenset(paths)
        _autoinit()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope.get("type") != "http"
            or scope.get("method") != "POST"
            or _facade._client is None
            or not self._tracked(scope)
        ):
            await self.app(scope, receive, send)
            return
        ex = _Exchange.begin(self)
        if ex is None:
            await self.app(scope, receive, send)
            return

        async def receive_() -> Message:
            message = await receive()
            if message.get("type") == "http.disconnect":
                ex.disconnected(_mono())
            return message

        async def send_(message: Message, /) -> None:
            kind = message.get("type")
            if kind == "http.response.body":
                t = _mono()
                more = message.get("more_body", False)
                if not more:
                    ex.closing = True
                try:
                    await send(message)
                except OSError:  # the connection is gone (ASGI 2.4; uvicorn, Starlette)
                    ex.send_failed = True
                    raise
                ex.body(message.get("body", b""), more, t)
            else:
                if kind == "http.response.start":
                    ex.start(message)
                await send(message)

        try:
            await self.app(scope, receive_, send_)
        except BaseException as exc:
            ex.failed(exc)
            raise
        ex.returned()

    def _tracked(self, scope: Scope) -> bool:
        path = scope.get("path", "")
        if path in self.paths:
            return True
        root = scope.get("root_path", "")
        return bool(root) and path.startswith(root) and path[len(root) :] in self.paths


class _Exchange:
    """One tracked request/response: the parser state and the ``Request`` timer."""

    __slots__ = (
        "broken",
        "closing",
        "code",
        "completion",
        "ended",
        "meta",
        "meta_tries",
        "mode",
        "partial",
        "prompt",
        "req",
        "send_failed",
        "skip",
        "tail",
    )

    def __init__(self, req: Request) -> None:
        self.req = req
        self.code: int | None = None
        self.mode = _NONE
        self.partial = b""  # the incomplete last SSE line
        self.skip = False  # inside an over-long SSE line: drop bytes up to its end
        self.tail = b""  # the end of the previous chunk of a JSON body
        self.meta = False  # id and model found, or no longer looked for
        self.meta_tries = 0
        self.prompt: int | None = None
        self.completion: int | None = None
        self.closing = False  # the last body message is being sent
        self.ended = False
        self.broken = False  # parsing gave up on this response
        self.send_failed = False

    @classmethod
    def begin(cls, mw: VigilMiddleware) -> _Exchange | None:
        try:
            client = _facade._client
            replica = mw.replica or (client.config.host if client is not None else None)
            req = Request(model=mw.model, replica=replica)
            return None if isinstance(req, _NoopRequest) else cls(req)
        except Exception:
            log.debug("vigil: could not start timing a request", exc_info=True)
            return None

    # -- events from the wrapped callables; none of them raises ---------------------------

    def start(self, message: Message) -> None:
        try:
            self.code = int(message.get("status", 200))
            ctype = b""
            for name, value in message.get("headers") or ():
                if bytes(name).lower() == b"content-type":
                    ctype = bytes(value).lower()
            if b"text/event-stream" in ctype:
                self.mode = _SSE
            elif b"json" in ctype:
                self.mode = _JSON
        except Exception:
            self.broken = True
            log.debug("vigil: unexpected response start", exc_info=True)

    def body(self, chunk: Any, more: bool, t: float) -> None:
        try:
            if chunk and not self.broken and not self.ended:
                if self.mode == _SSE:
                    n = self._feed_sse(bytes(chunk))
                    if n:
                        self.req._add(t, n)
                elif self.mode == _JSON:
                    self._feed_json(bytes(chunk))
        except Exception:
            self.broken = True
            log.debug("vigil: could not parse a response chunk", exc_info=True)
        if not more:
            self.finish(t, None)

    def disconnected(self, t: float) -> None:
        if not self.closing:
            self.finish(t, "aborted_by_client")

    def failed(self, exc: BaseException) -> None:
        asyncio = sys.modules.get("asyncio")
        cancelled = asyncio is not None and isinstance(exc, asyncio.CancelledError)
        self.finish(_mono(), "aborted_by_client" if cancelled or self.send_failed else "error")

    def returned(self) -> None:
        self.finish(_mono(), None)

    def finish(self, t: float, status: str | None) -> None:
        if self.ended:
            return
        self.ended = True
        try:
            if status is None:
                status = _status_for(self.code)
            out = self.completion
            if out is None and self.mode != _SSE:
                out = 0 if status != "ok" else None
            self.req._finish(t, status, out, self.prompt, None)
        except Exception:
            log.debug("vigil: could not end a request", exc_info=True)

    # -- parsing -----------------------------------------------------------------------

    def _feed_sse(self, chunk: bytes) -> int:
        data = self.partial + chunk if self.partial else chunk
        if self.skip:
            nl = data.find(b"\n")
            if nl < 0:
                self.partial = b""
                return 0
            data, self.skip = data[nl + 1 :], False
        lines = data.split(b"\n")
        rest = lines.pop()
        if len(rest) > MAX_LINE:
            rest, self.skip = b"", True
        self.partial = rest
        n = 0
        for line in lines:
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload and payload != b"[DONE]":
                    n += self._payload(payload)
        return n

    def _payload(self, p: bytes) -> int:
        """Tokens carried by one SSE data payload (0 or, per choice, 1); notes usage."""
        if not self.meta:
            self._meta(p)
        if _USAGE in p:
            self._usage(p)
        # The usual chunk of a compact JSON server (vLLM, SGLang): one choice, one delta
        # with content, or one text. Quotes inside JSON strings are escaped, so these
        # byte patterns can only match the structure itself.
        i = p.find(_CHAT_TOKEN)
        if i >= 0:
            j = i + len(_CHAT_TOKEN)
            if (
                p[j : j + 1] != b'"'
                and p.find(b'"delta"') == i
                and p.find(b'"delta"', j) < 0
                and b'"text"' not in p
            ):
                return 1
        else:
            i = p.find(_TEXT_TOKEN)
            if i >= 0:
                j = i + len(_TEXT_TOKEN)
                if p[j : j + 1] != b'"' and p.count(b'"text"') == 1 and b'"delta"' not in p:
                    return 1
            elif b'"delta"' not in p and b'"text"' not in p:
                return 0
        return _tokens_in(p)

    def _feed_json(self, chunk: bytes) -> None:
        if not self.meta:
            self._meta(chunk[:META_BYTES])
        window = self.tail + chunk if self.tail else chunk
        if b'_tokens"' in window:
            self._usage(window)
        self.tail = window[-OVERLAP:]

    def _usage(self, p: bytes) -> None:
        for m in _COMPLETION.finditer(p):
            self.completion = int(m.group(1))
        for m in _PROMPT.finditer(p):
            self.prompt = int(m.group(1))

    def _meta(self, p: bytes) -> None:
        """The response's id (and model), from the first payloads that have one."""
        self.meta_tries += 1
        m = _ID.search(p, 0, META_BYTES)
        if m is not None:
            self.req.id = m.group(1).decode("utf-8", "replace")
        self.meta = m is not None or self.meta_tries >= META_TRIES
        if self.req.model is None:
            m = _MODEL.search(p, 0, META_BYTES)
            if m is not None:
                self.req.model = m.group(1).decode("utf-8", "replace")


def _tokens_in(p: bytes) -> int:
    """Tokens in one chunk, the slow and sure way: one per choice with output."""
    try:
        obj = json.loads(p)
    except ValueError:
        return 0
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list):
        return 0
    n = 0
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        text = choice.get("text")
        if isinstance(text, str) and text:
            n += 1
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and any(v for k, v in delta.items() if k != "role"):
            n += 1
    return n


def _status_for(code: int | None) -> str:
    if code is None:
        return "error"  # the app returned without a response
    if code in (429, 503):
        return "rejected"
    return "error" if code >= 400 else "ok"


def _autoinit() -> None:
    """Start the collector in a server launched with only ``--middleware`` and VIGIL_*."""
    try:
        if _facade.get_client() is None and os.environ.get("VIGIL_ENDPOINT"):
            _facade.init(kind=os.environ.get("VIGIL_KIND") or "serving", integrations=False)
    except Exception:
        log.warning("vigil: could not initialise the collector", exc_info=True)

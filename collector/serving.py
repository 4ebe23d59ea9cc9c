"""Per-request timing for LLM servers: one ``request`` event per served request.

    import collector as vigil

    vigil.init(job="llama-8b-chat", kind="serving")
    with vigil.serving.Request(prompt_tokens=len(prompt), model="llama-8b") as r:
        for chunk in generate(prompt):
            r.token()                    # one output token went out, now
            yield chunk
    # leaving the block ends the request: status "ok", or "error" if the body raised
    # (the exception still propagates; it is never swallowed)

    r = vigil.serving.Request(id="req-17")      # or without ``with``
    r.scheduled()                               # optional: left the queue, prefill starts
    r.first_token()
    r.token(n=4)                                # a chunk of 4 tokens, delivered now
    r.end(status="ok", output_tokens=None)      # counts the tokens itself when None

Statuses: ``ok``, ``error``, ``aborted_by_client``, ``rejected``; a ``with`` block whose
task is cancelled (the usual sign of a client gone away) ends ``aborted_by_client``.
``end()`` may be called once; later calls, and tokens after it, are ignored. A ``Request``
belongs to one thread or task (it takes no lock). Before ``vigil.init()``, or without an
endpoint, ``Request(...)`` returns a shared do-nothing object, so instrumented servers pay
a ``None`` check.

**Clock model.** At creation a request reads the wall clock once (``time.time()``, its
``arrival``) and the monotonic clock once. Every later instant (tokens, end) is a
monotonic reading, reported as ``arrival + (reading - reading_at_arrival)``. So phases and
gaps within a request are exact and immune to wall-clock steps (NTP), and requests are
placed on the wall clock by their arrival.

**Cost.** ``token()`` appends one monotonic reading to an ``array('d')``. ``end()`` builds
the event (gaps, sampling, encoding; about 0.2 µs a token, C loops where it matters) and
puts it on the collector's bounded queue without blocking; a full queue drops the event
and counts it (``dropped["queue_full"]`` in the next heartbeat).
``bench/serving_collector.py`` measures both. The encoding stays in ``end()`` rather than
on the shipping thread: under the GIL that thread would spend the same CPU and take the
GIL from the event loop anyway, and queued raw readings would be several times larger
than their encoding. Memory per request is bounded: at most ``_FOLD_AT`` raw readings plus
``VIGIL_MAX_TOKEN_TIMES`` sampled ones, however long the output.

**Token times (``token_times``, encoding ``dv1``).** With n output tokens and stride k, the
recorded tokens are the indices 0, k, 2k, … below n, plus n − 1 when it is not among them;
token 0 is delivered at ``first_token``. ``data`` is standard base64 (padded) of unsigned
LEB128 varints, one per recorded token after token 0: varint j is
``round((t[i_j] - first_token) * 1e4) - round((t[i_(j-1)] - first_token) * 1e4)``, the
difference of consecutive offsets each rounded to 100 µs (so rounding never accumulates:
every decoded time is within 50 µs of the true one). k is 1 unless that would record more
than ``VIGIL_MAX_TOKEN_TIMES`` tokens (default 4096); then k is the smallest power of two
with ``ceil((n - 1) / k) + 1 <= VIGIL_MAX_TOKEN_TIMES`` (``stride_for``). A power of two
lets the collector halve its samples as a long output grows, so it never holds them all.
``max_tbt_s`` is computed from every token, not from the samples. ``token_times`` is sent
when at least two tokens were timed and ``output_tokens`` equals the number timed (a
server that reports a different count at ``end()`` gets TTFT and ``max_tbt_s`` only).
"""

from __future__ import annotations

import binascii
import contextlib
import itertools
import logging
import math
import operator
import os
import sys
import time
from array import array
from collections.abc import Sequence
from typing import Any

import collector as _facade

__all__ = ["STATUSES", "Request", "encode_token_times", "recorded_indices", "stride_for"]

log = logging.getLogger("vigil.collector")

STATUSES = ("ok", "error", "aborted_by_client", "rejected")
DEFAULT_MAX_TOKEN_TIMES = 4096
UNITS_PER_S = 10_000.0  # token times travel in units of 100 µs
MAX_PROMPT_TOKENS = 2**31 - 1
MAX_OUTPUT_TOKENS = 1_000_000  # what the ingest contract accepts per request
MAX_NAME = 128
_FOLD_AT = 1024  # raw readings kept before they are folded into samples

_mono = time.monotonic
_wall = time.time
_sub = operator.sub
_ID_PREFIX = os.urandom(3).hex()
_ids = itertools.count(1)


def stride_for(output_tokens: int, max_times: int = DEFAULT_MAX_TOKEN_TIMES) -> int:
    """The stride the collector uses for ``output_tokens`` tokens: 1, or the smallest power
    of two that records at most ``max_times`` tokens.

    >>> stride_for(4096), stride_for(4097), stride_for(100_000)
    (1, 2, 32)
    """
    limit = max(2, max_times)
    n = output_tokens
    k = 1
    while n > 1 and -(-(n - 1) // k) + 1 > limit:
        k *= 2
    return k


def recorded_indices(output_tokens: int, stride: int) -> list[int]:
    """The token indices a record carries: 0, k, 2k, … below n, plus n − 1.

    >>> recorded_indices(10, 4)
    [0, 4, 8, 9]
    """
    if output_tokens <= 0:
        return []
    out = list(range(0, output_tokens, stride))
    if out[-1] != output_tokens - 1:
        out.append(output_tokens - 1)
    return out


def encode_token_times(times: Sequence[float]) -> str:
    """``data`` of a ``dv1`` record from the recorded tokens' times (any clock, seconds),
    token 0 first. (A time earlier than the one before it is sent as equal to it.)

    >>> encode_token_times([5.0, 5.01, 5.03, 5.0428])   # deltas 100, 200, 128
    'ZMgBgAE='
    """
    if len(times) < 2:
        return ""
    first = times[0]
    out = bytearray()
    put = out.append
    previous = 0
    for t in times[1:]:
        units = round((t - first) * UNITS_PER_S)
        d = units - previous
        if d < 0x80:
            if d < 0:  # a time earlier than the one before: repeat that one
                put(0)
                continue
            put(d)
        elif d < 0x4000:
            put((d & 0x7F) | 0x80)
            put(d >> 7)
        else:
            while d >= 0x80:
                put((d & 0x7F) | 0x80)
                d >>= 7
            put(d)
        previous = units
    return binascii.b2a_base64(out, newline=False).decode("ascii")


_limit_for: tuple[object, int] = (None, DEFAULT_MAX_TOKEN_TIMES)


def max_token_times() -> int:
    """``VIGIL_MAX_TOKEN_TIMES`` (at least 2), read again whenever the client changes."""
    global _limit_for
    client = _facade._client
    cached_for, limit = _limit_for
    if client is not cached_for:
        raw = os.environ.get("VIGIL_MAX_TOKEN_TIMES", "").strip()
        try:
            limit = max(2, int(raw)) if raw else DEFAULT_MAX_TOKEN_TIMES
        except ValueError:
            limit = DEFAULT_MAX_TOKEN_TIMES
        _limit_for = (client, limit)
    return limit


class Request:
    """Times one served request; see the module docstring."""

    __slots__ = (
        "_buf",
        "_done",
        "_first",
        "_k",
        "_kept",
        "_last",
        "_m0",
        "_max_gap",
        "_n",
        "_sched",
        "_wall0",
        "id",
        "model",
        "prompt_tokens",
        "replica",
    )

    id: str | None
    prompt_tokens: int | None
    model: str | None
    replica: str | None
    _m0: float  # monotonic reading at arrival
    _wall0: float  # wall clock at arrival
    _buf: array[float]  # raw readings, not yet folded into samples
    _n: int  # tokens folded
    _kept: array[float] | None  # samples: the times of tokens 0, k, 2k, … folded so far
    _k: int  # the stride
    _first: float
    _last: float  # the last folded token's time
    _max_gap: float
    _sched: float | None
    _done: bool

    def __new__(
        cls,
        id: str | None = None,
        prompt_tokens: int | None = None,
        model: str | None = None,
        replica: str | None = None,
    ) -> Request:
        if _facade._client is None:
            return _NOOP
        try:
            self = object.__new__(cls)
            self._m0 = _mono()
            self._wall0 = _wall()
            self._buf = array("d")
            self._n = 0
            self._kept = None
            self._k = 1
            self._first = 0.0
            self._last = 0.0
            self._max_gap = 0.0
            self._sched = None
            self._done = False
            self.id = id
            self.prompt_tokens = prompt_tokens
            self.model = model
            self.replica = replica
            return self
        except Exception:
            log.debug("vigil: could not start a request timer", exc_info=True)
            return _NOOP

    # -- the hot path ------------------------------------------------------------------

    def token(self, n: int = 1) -> None:
        """``n`` output tokens were delivered now (a streamed chunk)."""
        try:
            if n == 1:
                buf = self._buf
                buf.append(_mono())
                if len(buf) >= _FOLD_AT:
                    self._fold()
            else:
                self._add(_mono(), n)
        except Exception:
            log.debug("vigil: token timing failed", exc_info=True)

    def first_token(self, n: int = 1) -> None:
        """The first ``n`` output tokens were delivered now. Same as ``token(n)`` for the
        first tokens; ignored once any token was recorded."""
        try:
            if self._n == 0 and not self._buf:
                self._add(_mono(), n)
        except Exception:
            log.debug("vigil: token timing failed", exc_info=True)

    def scheduled(self) -> None:
        """The request left the server's queue now (``queue_s`` = now − arrival)."""
        try:
            if self._sched is None:
                self._sched = _mono()
        except Exception:
            log.debug("vigil: request timing failed", exc_info=True)

    def end(
        self,
        status: str = "ok",
        output_tokens: int | None = None,
        *,
        prompt_tokens: int | None = None,
        queue_s: float | None = None,
    ) -> None:
        """Finish the request and queue its event. ``output_tokens`` defaults to the
        tokens recorded; ``prompt_tokens`` and ``queue_s`` fill in what was not known at
        creation."""
        self._finish(_mono(), status, output_tokens, prompt_tokens, queue_s)

    def __enter__(self) -> Request:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> None:
        if exc_type is None:
            status = "ok"
        elif _is_cancellation(exc_type):
            status = "aborted_by_client"
        else:
            status = "error"
        self._finish(_mono(), status, None, None, None)
        # returns None: the user's exception, if any, propagates unchanged

    # -- recording -----------------------------------------------------------------------

    def _add(self, t: float, n: int) -> None:
        """``n`` tokens delivered at monotonic time ``t``."""
        if n <= 0 or self._done:
            return
        buf = self._buf
        if n == 1:
            buf.append(t)
            if len(buf) >= _FOLD_AT:
                self._fold()
            return
        if len(buf) + n <= _FOLD_AT:
            buf.extend(array("d", (t,)) * n)
            if len(buf) >= _FOLD_AT:
                self._fold()
            return
        # A long run at one instant: fold what is buffered, then account for the run
        # without materialising it.
        self._fold()
        limit = max_token_times()
        start, stop = self._n, self._n + n
        if start == 0:
            self._first = t
        else:
            self._max_gap = max(self._max_gap, t - self._last)
        kept = self._kept if self._kept is not None else array("d")
        k = self._k
        while len(kept) + (-(-stop // k) - -(-start // k)) > limit:
            k *= 2
            kept = kept[::2]
        kept.extend(array("d", (t,)) * (-(-stop // k) - -(-start // k)))
        self._kept, self._k, self._n, self._last = kept, k, stop, t

    def _fold(self) -> None:
        """Move the raw readings into the samples (indices ≡ 0 mod k), keeping the largest
        gap between consecutive tokens, and halve the samples while there are too many."""
        buf = self._buf
        self._buf = array("d")
        if not buf or self._done:
            return
        start = self._n
        if start == 0:
            self._first = buf[0]
        else:
            self._max_gap = max(self._max_gap, buf[0] - self._last)
        if len(buf) > 1:
            self._max_gap = max(self._max_gap, max(map(_sub, buf[1:], buf[:-1])))
        kept = self._kept if self._kept is not None else array("d")
        k = self._k
        kept.extend(buf[(-start) % k :: k])
        limit = max_token_times()
        while len(kept) > limit:
            k *= 2
            kept = kept[::2]
        self._kept, self._k, self._n, self._last = kept, k, start + len(buf), buf[-1]

    # -- the event ---------------------------------------------------------------------

    def _finish(
        self,
        t: float,
        status: str,
        output_tokens: int | None,
        prompt_tokens: int | None,
        queue_s: float | None,
    ) -> None:
        try:
            if self._done:
                return
            client = _facade._client
            if client is None:
                self._done = True
                return
            event = self._event(t, status, output_tokens, prompt_tokens, queue_s)
            self._done = True
            client.submit(event)
        except Exception:
            self._done = True
            log.debug("vigil: could not record a request", exc_info=True)
            _count_drop("bad_request")

    def _event(
        self,
        t: float,
        status: str,
        output_tokens: int | None,
        prompt_tokens: int | None,
        queue_s: float | None,
    ) -> dict[str, Any]:
        wall0, m0 = self._wall0, self._m0
        end = wall0 + (t - m0)
        event: dict[str, Any] = {
            "type": "request",
            "id": _name(self.id) or f"{_ID_PREFIX}-{os.getpid():x}-{next(_ids)}",
            "arrival": wall0,
            "end": end,
            "status": _status(status),
        }
        buf = self._buf
        timed = self._n + len(buf)
        # Nothing timed and nothing reported: unknown, not zero.
        n = (timed or None) if output_tokens is None else _count(output_tokens, MAX_OUTPUT_TOKENS)
        if n is not None:
            event["output_tokens"] = n
        prompt = _count(prompt_tokens if prompt_tokens is not None else self.prompt_tokens)
        if prompt is not None:
            event["prompt_tokens"] = prompt
        if queue_s is not None:
            q = float(queue_s)
            if q >= 0 and math.isfinite(q):
                event["queue_s"] = q
        elif self._sched is not None:
            event["queue_s"] = self._sched - m0
        for key in ("model", "replica"):
            value = _name(getattr(self, key))
            if value:
                event[key] = value
        if timed == 0:
            if n:  # tokens reported but none timed: delivered all at once, at the end
                event["first_token"] = end
            return event
        if self._n == 0 and len(buf) <= max_token_times():
            # The common case: every reading is still raw, stride 1.
            event["first_token"] = wall0 + (buf[0] - m0)
            if timed >= 2:
                event["max_tbt_s"] = max(map(_sub, buf[1:], buf[:-1]))
                if n == timed:
                    data = encode_token_times(buf)
                    event["token_times"] = {"enc": "dv1", "stride": 1, "data": data}
            return event
        self._fold()
        event["first_token"] = wall0 + (self._first - m0)
        if timed >= 2:
            event["max_tbt_s"] = self._max_gap
            if n == timed:
                k, times = self._samples(timed)
                data = encode_token_times(times)
                event["token_times"] = {"enc": "dv1", "stride": k, "data": data}
        return event

    def _samples(self, n: int) -> tuple[int, array[float]]:
        """The stride and the recorded tokens' times (indices as ``recorded_indices``)."""
        kept = self._kept if self._kept is not None else array("d")
        k, limit = self._k, max_token_times()
        while True:
            times = array("d", kept)
            if (n - 1) % k:
                times.append(self._last)
            if len(times) <= limit:
                return k, times
            k *= 2
            kept = kept[::2]


class _NoopRequest(Request):
    """What ``Request(...)`` returns while the collector is off: every method does nothing."""

    __slots__ = ()

    def token(self, n: int = 1) -> None:
        pass

    def first_token(self, n: int = 1) -> None:
        pass

    def scheduled(self) -> None:
        pass

    def end(
        self,
        status: str = "ok",
        output_tokens: int | None = None,
        *,
        prompt_tokens: int | None = None,
        queue_s: float | None = None,
    ) -> None:
        pass

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> None:
        pass

    def _add(self, t: float, n: int) -> None:
        pass

    def _finish(
        self,
        t: float,
        status: str,
        output_tokens: int | None,
        prompt_tokens: int | None,
        queue_s: float | None,
    ) -> None:
        pass


_NOOP: Request = object.__new__(_NoopRequest)


def _is_cancellation(exc_type: type[BaseException]) -> bool:
    """An asyncio/anyio task cancelled mid-request: on a server, the client went away."""
    asyncio = sys.modules.get("asyncio")
    return asyncio is not None and issubclass(exc_type, asyncio.CancelledError)


def _status(status: object) -> str:
    if isinstance(status, str) and status:
        return status[:32]
    return "error"


def _name(value: object) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    return text[:MAX_NAME] or None


def _count(value: object, top: int = MAX_PROMPT_TOKENS) -> int | None:
    """A token count the ingest contract accepts, else None (never a rejected batch)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        n = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None
    return n if 0 <= n <= top else None


def _count_drop(reason: str) -> None:
    client = _facade._client
    if client is not None:
        with contextlib.suppress(Exception):
            client.worker.drop(reason)

"""Read a PyTorch profiler (Kineto) trace file one event at a time, in bounded memory.

A Kineto trace is one JSON object, ``{"traceEvents": [...], "distributedInfo": {...}, ...}``,
often hundreds of megabytes (gigabytes for a long profile): ``json.load`` would hold all of
it, as Python objects about ten times its size. ``iter_trace`` reads the file (plain or
gzip, by its first bytes) in 1 MiB chunks and decodes one top-level value or one event at a
time, so memory holds a chunk and one event, whatever the file's size:

    for kind, key, value in iter_trace("rank-0.json.gz"):
        if kind == "event":          # one element of traceEvents (key: its index)
            ...
        else:                        # "meta": another top-level field (key: its name)
            ...

Every problem is a ``KinetoError`` naming the file and what is wrong with it.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

CHUNK = 1 << 20
# The most text one value (one event, one top-level field) may take: past it the file is
# refused rather than read into memory whole (an unterminated string looks like this too).
MAX_VALUE_CHARS = 64 << 20
_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class KinetoError(ValueError):
    """A trace that cannot be imported; the message names the file and the problem."""


class _Text:
    """A JSON text read in chunks: a buffer, a position in it, and refills on demand."""

    def __init__(self, stream: IO[str], source: str) -> None:
        self.stream = stream
        self.source = source
        self.buf = ""
        self.pos = 0
        self.offset = 0  # characters consumed before ``buf``
        self.eof = False

    def fill(self) -> bool:
        """Read another chunk onto the unread part of the buffer; False at the end."""
        if self.eof:
            return False
        try:
            data = self.stream.read(CHUNK)
        except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
            raise KinetoError(f"{self.source}: cannot read ({_why(exc)})") from None
        if not data:
            self.eof = True
            return False
        self.offset += self.pos
        self.buf = self.buf[self.pos :] + data
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next character after white space ('' at the end of the text)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf) or not self.fill():
                return self.buf[self.pos : self.pos + 1]

    def expect(self, chars: str, what: str) -> str:
        c = self.peek()
        if not c or c not in chars:
            found = repr(c) if c else "the end of the file"
            raise KinetoError(
                f"{self.source}: not valid JSON at character {self.at}: "
                f"expected {what}, found {found}"
            )
        self.pos += 1
        return c

    @property
    def at(self) -> int:
        return self.offset + self.pos

    def value(self) -> Any:
        """Decode the next JSON value, reading more of the file while it is incomplete."""
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self.fill() and len(self.buf) - self.pos <= MAX_VALUE_CHARS:
                    continue
                raise self._invalid(exc) from None
            # A number may go on in the next chunk: decode it again with more text.
            if end == len(self.buf) and not self.eof and self.fill():
                continue
            self.pos = end
            return value

    def _invalid(self, exc: json.JSONDecodeError) -> KinetoError:
        if not self.eof:
            return KinetoError(
                f"{self.source}: one value at character {self.at} is over "
                f"{MAX_VALUE_CHARS >> 20} MiB of text or not valid JSON ({exc.msg})"
            )
        truncated = "; a truncated file?" if exc.pos >= len(self.buf.rstrip()) else ""
        return KinetoError(
            f"{self.source}: not valid JSON at character {self.offset + exc.pos} "
            f"({exc.msg}){truncated}"
        )


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _open(path: Path) -> IO[str]:
    """The file as text, gunzipped when it is gzip (by its first bytes, not its name)."""
    try:
        with path.open("rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
        if gzipped:
            return gzip.open(path, "rt", encoding="utf-8")
        return path.open(encoding="utf-8")
    except OSError as exc:
        raise KinetoError(f"{path}: cannot read ({_why(exc)})") from None


def iter_trace(path: str | Path) -> Iterator[tuple[str, str | int, Any]]:
    """``("meta", name, value)`` for each top-level field but ``traceEvents``, and
    ``("event", index, event)`` for each of its elements, in file order."""
    p = Path(path)
    with _open(p) as stream:
        text = _Text(stream, str(p))
        if text.peek() != "{":
            raise KinetoError(f"{p}: not a PyTorch profiler trace (a JSON object with traceEvents)")
        text.pos += 1
        seen_events = False
        if text.peek() == "}":
            text.pos += 1
        else:
            while True:
                key = text.value()
                if not isinstance(key, str):
                    raise KinetoError(f"{p}: not valid JSON at character {text.at}")
                text.expect(":", "':'")
                if key == "traceEvents":
                    seen_events = True
                    yield from _events(text)
                else:
                    yield "meta", key, text.value()
                if text.expect(",}", "',' or '}'") == "}":
                    break
        if text.peek():
            raise KinetoError(f"{p}: not valid JSON: text after the end, at character {text.at}")
    if not seen_events:
        raise KinetoError(f"{p}: no traceEvents: not a PyTorch profiler (Kineto) trace")


def _events(text: _Text) -> Iterator[tuple[str, int, Any]]:
    text.expect("[", "the traceEvents list '['")
    if text.peek() == "]":
        text.pos += 1
        return
    index = 0
    while True:
        yield "event", index, text.value()
        index += 1
        if text.expect(",]", "',' or ']' in traceEvents") == "]":
            return

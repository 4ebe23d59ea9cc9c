"""Readers for public LLM serving traces: request arrivals with prompt and output sizes.

    requests = read_trace(Path("AzureLLMInferenceTrace_conv.csv"), limit=300)
    requests[0]    # TraceRequest(index=0, arrival_s=0.0, prompt_tokens=374, output_tokens=44)

Every reader returns the requests sorted by arrival, the first arriving at 0.0 (seconds).

- ``azure``: the Azure LLM inference trace 2023 (Splitwise, ISCA'24), CSV with columns
  ``TIMESTAMP,ContextTokens,GeneratedTokens``; stamps like ``2023-11-16 18:15:46.6805900``
  (7 fractional digits, trimmed to 6 to parse).
- ``mooncake``: the Mooncake traces (FAST'25), JSON lines with ``timestamp`` (ms),
  ``input_length``, ``output_length`` and ``hash_ids``.
- ``burstgpt``: BurstGPT, CSV with columns ``Timestamp`` (s), ``Model``, ``Request tokens``,
  ``Response tokens``, ``Total tokens``, ``Log Type``.

``auto`` tells them apart by the first line. BurstGPT rows with 0 response tokens are requests
that failed in the original service; they are skipped (``skipped`` counts them).
"""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

FORMATS = ("azure", "mooncake", "burstgpt")


class TraceError(ValueError):
    """The file is not a trace of the expected format; the message names the line."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    index: int  # position in the trace, from 0
    arrival_s: float  # seconds after the first request
    prompt_tokens: int
    output_tokens: int
    model: str | None = None  # BurstGPT's Model column


@dataclass
class Trace:
    format: str
    requests: list[TraceRequest]
    skipped: int = 0  # rows left out (BurstGPT's failed requests)
    path: Path | None = field(default=None, compare=False)

    @property
    def duration_s(self) -> float:
        return self.requests[-1].arrival_s if self.requests else 0.0


def detect_format(path: Path) -> str:
    """``azure``, ``mooncake`` or ``burstgpt``, from the file's first line."""
    with path.open(encoding="utf-8-sig") as f:
        first = f.readline().strip()
    if first.startswith("{"):
        return "mooncake"
    header = {c.strip().lower() for c in first.split(",")}
    if {"timestamp", "contexttokens", "generatedtokens"} <= header:
        return "azure"
    if {"timestamp", "request tokens", "response tokens"} <= header:
        return "burstgpt"
    raise TraceError(
        f"{path}: cannot tell the trace format from its first line {first[:80]!r} "
        f"(known: {', '.join(FORMATS)})"
    )


def read_trace(path: Path, format: str = "auto", limit: int | None = None) -> Trace:
    """The first ``limit`` requests (all when None) of a trace file."""
    fmt = detect_format(path) if format == "auto" else format
    if fmt not in FORMATS:
        raise TraceError(f"unknown trace format {fmt!r} (known: auto, {', '.join(FORMATS)})")
    rows: Iterable[tuple[int, float, int, int, str | None]]
    skipped = [0]
    with path.open(encoding="utf-8-sig", newline="") as f:
        if fmt == "azure":
            rows = _azure(f, path)
        elif fmt == "mooncake":
            rows = _mooncake(f, path)
        else:
            rows = _burstgpt(f, path, skipped)
        raw = list(itertools.islice(rows, limit))
    return Trace(fmt, _zero_based(raw), skipped=skipped[0], path=path)


def _zero_based(rows: list[tuple[int, float, int, int, str | None]]) -> list[TraceRequest]:
    rows.sort(key=lambda r: r[1])  # stable: ties keep the file's order
    t0 = rows[0][1] if rows else 0.0
    return [
        TraceRequest(index=i, arrival_s=t - t0, prompt_tokens=p, output_tokens=o, model=m)
        for i, (_, t, p, o, m) in enumerate(rows)
    ]


def _count(raw: str | None, what: str, where: str) -> int:
    try:
        n = int(str(raw).strip())
    except ValueError:
        raise TraceError(f"{where}: {what} must be a whole number, not {raw!r}") from None
    if n < 0:
        raise TraceError(f"{where}: {what} is negative ({n})")
    return n


def _columns(reader: csv.DictReader[str], wanted: tuple[str, ...], path: Path) -> None:
    missing = [c for c in wanted if c not in (reader.fieldnames or ())]
    if missing:
        raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")


def _azure(f: Iterable[str], path: Path) -> Iterator[tuple[int, float, int, int, None]]:
    reader = csv.DictReader(f)
    _columns(reader, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"), path)
    first: datetime | None = None  # the stamps carry no zone: only differences matter
    for n, row in enumerate(reader):
        where = f"{path}:{n + 2}"
        stamp = (row["TIMESTAMP"] or "").strip()
        head, dot, frac = stamp.partition(".")
        try:  # 7 fractional digits: datetime takes 6
            when = datetime.fromisoformat(head + (dot + frac[:6] if dot else ""))
            first = first or when
            t = (when - first).total_seconds()
        except ValueError:
            raise TraceError(f"{where}: bad TIMESTAMP {stamp!r}") from None
        yield (
            n,
            t,
            _count(row["ContextTokens"], "ContextTokens", where),
            _count(row["GeneratedTokens"], "GeneratedTokens", where),
            None,
        )


def _mooncake(f: Iterable[str], path: Path) -> Iterator[tuple[int, float, int, int, None]]:
    for n, line in enumerate(f):
        if not line.strip():
            continue
        where = f"{path}:{n + 1}"
        try:
            obj = json.loads(line)
            t = float(obj["timestamp"]) / 1000.0
        except (ValueError, KeyError, TypeError) as exc:
            raise TraceError(f"{where}: not a Mooncake request ({exc})") from None
        yield (
            n,
            t,
            _count(obj.get("input_length"), "input_length", where),
            _count(obj.get("output_length"), "output_length", where),
            None,
        )


def _burstgpt(
    f: Iterable[str], path: Path, skipped: list[int]
) -> Iterator[tuple[int, float, int, int, str | None]]:
    reader = csv.DictReader(f)
    _columns(reader, ("Timestamp", "Request tokens", "Response tokens"), path)
    for n, row in enumerate(reader):
        where = f"{path}:{n + 2}"
        try:
            t = float(row["Timestamp"])
        except (TypeError, ValueError):
            raise TraceError(f"{where}: bad Timestamp {row['Timestamp']!r}") from None
        output = _count(row["Response tokens"], "Response tokens", where)
        if output == 0:  # failed in the original service
            skipped[0] += 1
            continue
        yield n, t, _count(row["Request tokens"], "Request tokens", where), output, row.get("Model")

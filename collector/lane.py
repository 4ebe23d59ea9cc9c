"""The heartbeat lane's rule: which ingest requests a full server still takes, so that
overload does not silence live ranks. One definition for both sides: the server admits by
it (``backend.ingest.admission``), the per-host relay sends a flush's heartbeats apart by
it (``collector.relay``). Standard library only, like the rest of the collector.

A batch (one ``POST /api/v1/ingest`` body, or one line of ``/api/v1/ingest/multi``) is
*heartbeat-only* when its body is at most ``MAX_BYTES`` and it holds 1 to ``MAX_EVENTS``
events, every one a ``heartbeat`` (a goodbye is one: an ``exiting`` heartbeat). A relay's
``/api/v1/ingest/multi`` request is when its body is at most ``MULTI_MAX_BYTES`` (the
server checks before and after gzip) and it holds 1 to ``MULTI_MAX_LINES`` lines, every one
heartbeat-only: a node's heartbeats of one flush, with room for a few flushes' worth.

    >>> heartbeat_only(b'{"batch_id": "b", "events": [{"type": "heartbeat", "ts": 1.0}]}')
    True
    >>> heartbeat_only(b'{"events": [{"type": "heartbeat"}, {"type": "step", "step": 1}]}')
    False
    >>> beat = b'{"events": [{"type": "heartbeat", "ts": 1.0}]}'
    >>> heartbeat_lines(beat + b"\\n" + beat)
    True
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

MAX_BYTES = 16 * 1024  # a heartbeat is a few hundred bytes; p2p peers make it more
MAX_EVENTS = 16  # a collector sends one; a few more if it batched some
MULTI_MAX_BYTES = 64 * 1024
MULTI_MAX_LINES = 64  # a node's ranks (8 to 16 in practice), a few heartbeats each


def heartbeats(batch: object) -> bool:
    """Whether a parsed batch holds 1 to ``MAX_EVENTS`` events, all heartbeats."""
    events = batch.get("events") if isinstance(batch, dict) else None
    if not isinstance(events, list) or not 0 < len(events) <= MAX_EVENTS:
        return False
    return all(isinstance(e, dict) and e.get("type") == "heartbeat" for e in events)


def heartbeat_only(body: bytes) -> bool:
    """Whether ``body`` (decompressed) is a heartbeat-only batch."""
    if len(body) > MAX_BYTES:
        return False
    try:
        return heartbeats(json.loads(body))
    except ValueError:
        return False


def heartbeat_lines(body: bytes) -> bool:
    """Whether ``body`` (NDJSON, decompressed; blank lines skipped) is a relay's request the
    lane takes: 1 to ``MULTI_MAX_LINES`` lines, each a heartbeat-only batch."""
    if len(body) > MULTI_MAX_BYTES:
        return False
    lines = [line for line in body.split(b"\n") if line.strip()]
    return 0 < len(lines) <= MULTI_MAX_LINES and all(heartbeat_only(line) for line in lines)


def parts(sizes: Sequence[int]) -> Iterator[slice]:
    """Heartbeat-only batches of these body sizes, in order, cut into requests the lane
    takes: at most ``MULTI_MAX_LINES`` lines and ``MULTI_MAX_BYTES`` (newlines counted) each.

    >>> list(parts([100] * 70))
    [slice(0, 64, None), slice(64, 70, None)]
    """
    start, size = 0, 0
    for i, n in enumerate(sizes):
        if i > start and (i - start >= MULTI_MAX_LINES or size + n + 1 > MULTI_MAX_BYTES):
            yield slice(start, i)
            start, size = i, 0
        size += n + 1
    if start < len(sizes):
        yield slice(start, len(sizes))

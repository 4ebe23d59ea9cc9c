"""Token delivery times in a request event: the ``dv1`` encoding.

    {"type": "request", …, "output_tokens": 128,
     "token_times": {"enc": "dv1", "stride": 1, "data": "<base64>"}}

Recorded tokens are the indices 0, k, 2k, … below n = ``output_tokens``, plus n − 1 when it
is not already among them (k = ``stride``); token 0 arrives at ``first_token``. ``data`` is
standard base64 of unsigned LEB128 varints, one per recorded token after token 0: the
difference between consecutive recorded tokens' offsets from ``first_token``, each offset
rounded to 100 µs first (so rounding never drifts). About 1–3 bytes a token.

    >>> import base64
    >>> data = base64.b64encode(bytes([100, 0xC8, 1, 0x80, 1])).decode()  # 100, 200, 128
    >>> decode_offsets(data, stride=1, output_tokens=4)
    [0.0, 0.01, 0.03, 0.0428]
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np

UNIT_S = 1e-4
MAX_RECORDED = 65_536  # token times one record may carry (the collector sends ≤ 4,096)


class TokenTimesError(ValueError):
    """The token times do not decode or do not fit the request; the message says why."""


def recorded_indices(output_tokens: int, stride: int) -> list[int]:
    """The token indices a record with this many tokens and this stride carries."""
    if output_tokens <= 0:
        return []
    out = list(range(0, output_tokens, stride))
    if out[-1] != output_tokens - 1:
        out.append(output_tokens - 1)
    return out


def expected_count(output_tokens: int, stride: int) -> int:
    """How many varints ``data`` must hold (every recorded token but token 0); arithmetic,
    so an absurd token count costs nothing to check."""
    if output_tokens <= 1:
        return 0
    last = output_tokens - 1
    return last // stride + (1 if last % stride else 0)


def decode_varints(raw: bytes) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """Unsigned LEB128 varints, decoded in numpy (no per-byte Python loop)."""
    b = np.frombuffer(raw, dtype=np.uint8)
    if b.size == 0:
        return np.zeros(0, dtype=np.uint64)
    last = np.flatnonzero((b & 0x80) == 0)
    if last.size == 0 or last[-1] != b.size - 1:
        raise TokenTimesError("data ends inside a varint")
    starts = np.concatenate(([0], last[:-1] + 1))
    lengths = last - starts + 1
    if int(lengths.max()) > 9:
        raise TokenTimesError("a delta does not fit 63 bits")
    position = np.arange(b.size) - np.repeat(starts, lengths)
    parts = (b & 0x7F).astype(np.uint64) << (7 * position).astype(np.uint64)
    return np.add.reduceat(parts, starts)


def decode_raw(data: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise TokenTimesError("data is not valid base64") from None


def decode_offsets(data: str | bytes, *, stride: int, output_tokens: int) -> list[float]:
    """Seconds after ``first_token`` of every recorded token (token 0 first, at 0.0)."""
    want = expected_count(output_tokens, stride)
    if want >= MAX_RECORDED:
        raise TokenTimesError(
            f"{output_tokens} output tokens at stride {stride} are {want + 1} token times, "
            f"more than {MAX_RECORDED}: raise the stride"
        )
    raw = decode_raw(data) if isinstance(data, str) else data
    deltas = decode_varints(raw)
    if deltas.size != want:
        raise TokenTimesError(
            f"holds {deltas.size} token times; {output_tokens} output tokens at stride "
            f"{stride} need {want}"
        )
    offsets = np.zeros(want + 1)
    np.cumsum(deltas, out=offsets[1:])
    result: list[float] = np.round(offsets * UNIT_S, 6).tolist()
    return result

"""Free-form JSON from a collector (event ``attrs``, an ``opseq``'s ops, an action's
``result``) must fit any JSON column: no NUL character in a string or key (PostgreSQL
refuses ``\\u0000``), no NaN or ±Infinity (not JSON; PostgreSQL refuses them), no integer
outside 64 bits (what readers, and ``jsonb`` consumers, can hold).

    plain_json({"path": "/ckpt/120", "step": 120})   # returned unchanged
    plain_json({"x": float("nan")})                  # ValueError: x: NaN or Infinity …

The common case costs one ``json.dumps`` (C) and two regex scans of its output; only
when one of them finds something does a walk look for where, to name it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, TypeVar

T = TypeVar("T")

# A ``\u0000`` escape in json.dumps output: preceded by an even run of backslashes (``\\\\``
# is an escaped backslash, so ``\\\\u0000`` is the text "\u0000", not a NUL).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_LONG_DIGITS = re.compile(r"\d{19,}")  # 2**63 has 19 digits
_INT64 = 2**63


def plain_json(value: T) -> T:
    """``value`` itself when it fits any JSON column, else ``ValueError`` naming where."""
    try:
        text = json.dumps(value, allow_nan=False)
    except ValueError:
        raise ValueError(_where(value) or "NaN or Infinity is not JSON") from None
    if _NUL_ESCAPE.search(text) or _LONG_DIGITS.search(text):
        problem = _where(value)
        if problem:  # long digits inside a string are fine: then nothing is found
            raise ValueError(problem)
    return value


def _where(value: Any, path: str = "") -> str | None:
    """The first problem in ``value``, as ``'a.b[2]: why'``, or None."""
    here = path or "value"
    if isinstance(value, str):
        return f"{here}: must not contain a NUL character" if "\x00" in value else None
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return None if -_INT64 <= value < _INT64 else f"{here}: integer beyond 64 bits"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{here}: NaN or Infinity is not JSON"
    if isinstance(value, dict):
        for key, item in value.items():
            if "\x00" in str(key):
                return f"{here}: a key must not contain a NUL character"
            if problem := _where(item, f"{path}.{key}" if path else str(key)):
                return problem
        return None
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if problem := _where(item, f"{path}[{i}]"):
                return problem
    return None

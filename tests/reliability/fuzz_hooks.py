"""Schemathesis hooks for the API fuzz (``test_fuzz.py``, loaded via ``SCHEMATHESIS_HOOKS``).

``POST /api/v1/ingest/multi`` takes NDJSON (``application/x-ndjson``), which schemathesis
has no serializer for. Its body is documented as a string: a generated string goes on the
wire as is (every line of it judged as an ingest batch). A value that is no string (the
negative cases for that schema) has no NDJSON text of its own — any text is a string — so
it goes as an empty body, which the server must refuse (400, "body holds no batch").
"""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx: Any, value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return b""

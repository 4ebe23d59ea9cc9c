"""The heartbeat lane: liveness gets in when telemetry is refused.

``POST /api/v1/ingest`` and ``POST /api/v1/ingest/multi`` admit at most
``VIGIL_MAX_INFLIGHT_INGEST`` requests at a time per process (``IngestGate``); past that
they answer ``429``. Refusing heartbeats with the telemetry would make live ranks look
silent, and the hang sweep would call them crashed: an overload would turn into false
crashes (and restarts). So when the gate is full, a request that is

- small: a declared ``Content-Length`` of at most ``LANE_MAX_BYTES`` (``MULTI_MAX_BYTES``
  on ``/ingest/multi``), and as much once decompressed, and
- heartbeat-only: a batch of 1 to ``LANE_MAX_EVENTS`` events, every one a ``heartbeat``
  (a goodbye is one: an ``exiting`` heartbeat); on ``/ingest/multi``, 1 to
  ``MULTI_MAX_LINES`` lines, every one such a batch (a relay's heartbeats of a flush: the
  relay sends them apart from the telemetry, ``collector.relay.server``),

takes a slot of a second gate (``VIGIL_MAX_INFLIGHT_LIVENESS``) instead. Such a request is
cheap: an upsert of its ranks' rows. The lane is bounded, so a flood of heartbeats cannot
take the server down either; when its slots are taken too, the heartbeat gets the same
``429`` as the telemetry. A request the lane will not take (too big, not heartbeat-only,
no ``Content-Length``) is refused as before, having cost at most its lane limit read.

The rule itself is the collector's (``collector.lane``), so the relay that splits a flush
and the server that admits it cannot disagree.

    if gate.try_enter(): ...                        # the normal path
    elif declared_small(request) and lane.try_enter():
        body = await read(request, LANE_MAX_BYTES)  # then heartbeat_only(body), or 429
"""

from __future__ import annotations

from starlette.requests import Request

from collector.lane import MAX_BYTES as LANE_MAX_BYTES
from collector.lane import MAX_EVENTS as LANE_MAX_EVENTS
from collector.lane import MULTI_MAX_BYTES, MULTI_MAX_LINES, heartbeat_lines, heartbeat_only

__all__ = [
    "LANE_MAX_BYTES",
    "LANE_MAX_EVENTS",
    "MULTI_MAX_BYTES",
    "MULTI_MAX_LINES",
    "declared_small",
    "heartbeat_lines",
    "heartbeat_only",
]


def declared_small(request: Request, limit: int = LANE_MAX_BYTES) -> bool:
    """Whether the request says its body is at most ``limit`` bytes (the lane's)."""
    declared = request.headers.get("content-length", "")
    return declared.isdigit() and int(declared) <= limit

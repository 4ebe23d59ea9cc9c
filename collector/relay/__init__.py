"""The per-host relay (issue 16): one process per node that the node's ranks ship to over
the loopback; it merges their batches and heartbeats into one request per flush to the
server, so a 16,384-rank job on 2,048 nodes costs the server about 2,048 requests a second,
not 16,384. Optional: ranks work the same without it.

    vigil relay --listen 127.0.0.1:8765 --endpoint http://vigil:8000 --token "$VIGIL_TOKEN"
    python -m collector.relay --endpoint http://vigil:8000     # the same, collector-only

and in the job's environment ``VIGIL_ENDPOINT=http://127.0.0.1:8765`` (same token). The
relay speaks ``POST /api/v1/ingest`` to the ranks and ``POST /api/v1/ingest/multi`` to the
server; what it guarantees is in ``collector.relay.server``. Standard library only, like
the rest of the collector.
"""

from __future__ import annotations

from collector.relay.buffer import Limits
from collector.relay.server import Relay, RelayConfig

__all__ = ["Limits", "Relay", "RelayConfig"]

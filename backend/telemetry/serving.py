"""Serving rollups: a serving job's requests summed per replica and minute, in the ingest
transaction that stores them (``serving_minutes``). The serving detectors and the serving
page read these sums, never the raw requests.

    add_serving_minutes(session=s, job_id=7, requests=[{"arrival": …, "end": …, …}, …])
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from backend.db import add_sums
from backend.telemetry.models import ServingMinute
from detectors.serving import request_metrics

SUMS = (
    "requests",
    "errors",
    "arrivals",
    "output_tokens",
    "ttft_sum",
    "ttft_n",
    "tpot_sum",
    "tpot_n",
    "queue_sum",
    "queue_n",
)


def replica_key(event: dict[str, Any], host: str | None = None) -> str:
    """The replica a request is counted under: ``model/replica``; without a replica name,
    the sending host stands for it (one server process per host is the common case)."""
    model, replica = event.get("model") or "", event.get("replica") or host or ""
    return f"{model}/{replica}" if model else replica


def finished_at(event: dict[str, Any]) -> float:
    """When a request counts as finished: its end, else its first token, else its arrival."""
    for key in ("end", "first_token"):
        if event.get(key) is not None:
            return float(event[key])
    return float(event["arrival"])


def add_serving_minutes(
    *, session: Session, job_id: int, requests: list[dict[str, Any]], host: str | None = None
) -> None:
    """Add a batch of request events to their (replica, minute) sums."""
    if not requests:
        return
    m = request_metrics(
        arrival=[e["arrival"] for e in requests],
        first_token=[e.get("first_token") for e in requests],
        end=[e.get("end") for e in requests],
        output_tokens=[e.get("output_tokens") for e in requests],
    )
    acc: dict[tuple[str, int], dict[str, float]] = defaultdict(lambda: dict.fromkeys(SUMS, 0))
    for i, e in enumerate(requests):
        replica = replica_key(e, host)
        done = acc[(replica, int(finished_at(e) // 60))]
        done["requests"] += 1
        done["errors"] += e.get("status", "ok") not in ("ok", "aborted_by_client")
        done["output_tokens"] += int(e.get("output_tokens") or 0)
        if np.isfinite(m.ttft[i]):
            done["ttft_sum"] += float(m.ttft[i])
            done["ttft_n"] += 1
        if np.isfinite(m.tpot[i]):
            done["tpot_sum"] += float(m.tpot[i])
            done["tpot_n"] += 1
        if e.get("queue_s") is not None:
            done["queue_sum"] += float(e["queue_s"])
            done["queue_n"] += 1
        acc[(replica, int(float(e["arrival"]) // 60))]["arrivals"] += 1
    rows = [
        {"job_id": job_id, "replica": replica, "minute": minute, **sums}
        for (replica, minute), sums in acc.items()
    ]
    add_sums(
        session, ServingMinute, keys=["job_id", "replica", "minute"], sums=list(SUMS), rows=rows
    )

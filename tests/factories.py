"""Builders for ingest batches, so tests say only what matters to them."""

from __future__ import annotations

import uuid
from typing import Any


def batch(events: list[dict[str, Any]] | None = None, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "batch_id": str(uuid.uuid4()),
        "job": "llama-8b-pretrain",
        "kind": "training",
        "rank": 0,
        "world_size": 4,
        "host": "node-1",
        "attempt": 0,
        "events": events if events is not None else [],
    }
    body.update(fields)
    return body


def step(n: int, **fields: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "step",
        "step": n,
        "ts": 1_732_233_000.0 + n,
        "duration_s": 0.31,
        "comm_s": 0.05,
        "data_s": 0.01,
        "loss": 2.31,
        "grad_norm": 1.1,
        "mem_bytes": 1_234_567,
        "opseq": "9f2c",
    }
    event.update(fields)
    return event


def every_event_type() -> list[dict[str, Any]]:
    """One event of each type, as in DESIGN.md's ingest example."""
    return [
        step(120),
        {
            "type": "collective",
            "step": 120,
            "group": "dp",
            "op": "all_reduce",
            "seq": 4501,
            "bytes": 4_194_304,
            "duration_s": 0.012,
            "count": 8,
        },
        {
            "type": "heartbeat",
            "ts": 1_732_233_120.9,
            "step": 121,
            "inflight": {"group": "dp", "op": "all_reduce", "seq": 4502, "since": 1_732_233_120.5},
        },
        {"type": "opseq", "hash": "9f2c", "ops": [["aten::mm", [[8, 256], [256, 256]], 8192]]},
        {
            "type": "request",
            "id": "r-17",
            "arrival": 1.0,
            "first_token": 1.2,
            "end": 3.4,
            "prompt_tokens": 512,
            "output_tokens": 128,
            "max_tbt_s": 0.09,
            "status": "ok",
        },
        {"type": "metric", "name": "tokens_per_s", "value": 41000.0, "step": 120},
        {"type": "event", "name": "checkpoint_saved", "step": 120, "attrs": {"path": "/ckpt/120"}},
    ]

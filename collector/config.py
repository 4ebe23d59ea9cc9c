"""Collector configuration: arguments first, then ``VIGIL_*`` environment, then defaults.

Rank, world size, local rank and restart attempt come from the variables torchrun sets
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``TORCHELASTIC_RESTART_COUNT``).

    >>> cfg = Config.resolve(job="llama", endpoint="http://vigil:8000", environ={"RANK": "3"})
    >>> (cfg.job, cfg.rank, cfg.enabled)
    ('llama', 3, True)
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "").strip()
    try:
        return int(raw) if raw else default
    except ValueError:
        return default  # a malformed variable must not break the user's job


def _float(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        return default
    return value if value == value and value >= 0 else default


@dataclass(frozen=True)
class Config:
    endpoint: str | None
    token: str | None
    job: str
    kind: str
    rank: int
    world_size: int
    local_rank: int
    attempt: int
    host: str
    # Shipping and sampling knobs (VIGIL_HEARTBEAT_S, VIGIL_FLUSH_S, …).
    heartbeat_s: float = 1.0
    flush_s: float = 1.0
    max_batch: int = 5000
    max_queue: int = 20_000
    timeout_s: float = 5.0
    exit_timeout_s: float = 2.0
    opseq_every: int = 100
    opseq_shapes: bool = True  # per-step module-shape fingerprint (VIGIL_OPSEQ_SHAPES=0: off)
    chaos: str = ""

    @property
    def enabled(self) -> bool:
        """Without an endpoint every collector call is a no-op."""
        return bool(self.endpoint)

    @classmethod
    def resolve(
        cls,
        *,
        endpoint: str | None = None,
        token: str | None = None,
        job: str | None = None,
        kind: str | None = None,
        environ: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> Config:
        env = os.environ if environ is None else environ
        endpoint = endpoint or env.get("VIGIL_ENDPOINT") or None
        rank = _int(env, "RANK", 0)
        world_size = max(_int(env, "WORLD_SIZE", 1), rank + 1)
        cfg = cls(
            endpoint=endpoint.rstrip("/") if endpoint else None,
            token=token or env.get("VIGIL_TOKEN") or None,
            job=job or env.get("VIGIL_JOB") or env.get("TORCHELASTIC_RUN_ID") or "default",
            kind=kind or env.get("VIGIL_KIND") or "training",
            rank=rank,
            world_size=world_size,
            local_rank=_int(env, "LOCAL_RANK", 0),
            attempt=_int(env, "TORCHELASTIC_RESTART_COUNT", 0),
            host=env.get("VIGIL_HOSTNAME") or socket.gethostname(),
            heartbeat_s=max(0.05, _float(env, "VIGIL_HEARTBEAT_S", 1.0)),
            flush_s=max(0.05, _float(env, "VIGIL_FLUSH_S", 1.0)),
            max_batch=max(1, _int(env, "VIGIL_MAX_BATCH", 5000)),
            max_queue=max(100, _int(env, "VIGIL_MAX_QUEUE", 20_000)),
            timeout_s=max(0.1, _float(env, "VIGIL_TIMEOUT_S", 5.0)),
            exit_timeout_s=_float(env, "VIGIL_EXIT_TIMEOUT_S", 2.0),
            opseq_every=max(0, _int(env, "VIGIL_OPSEQ_EVERY", 100)),
            opseq_shapes=_int(env, "VIGIL_OPSEQ_SHAPES", 1) != 0,
            chaos=env.get("VIGIL_CHAOS", ""),
        )
        known = {k: v for k, v in overrides.items() if k in cls.__dataclass_fields__}
        return replace(cfg, **known) if known else cfg

"""Collector configuration: arguments first, then ``VIGIL_*`` environment, then defaults.

Rank, world size, local rank and restart attempt come from the variables torchrun sets
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``TORCHELASTIC_RESTART_COUNT``). The run (this
launch of the job; restarts stay in it) is ``VIGIL_RUN_ID`` (``vigil run`` sets it), else
torchrun's ``TORCHELASTIC_RUN_ID`` (unless it is ``none``), else ``SLURM_JOB_ID``; a lone
process outside any launcher is a run of its own. Without any, the server tells launches
apart by their silences (``backend.jobs.launches``).

    >>> cfg = Config.resolve(job="llama", endpoint="http://vigil:8000", environ={"RANK": "3"})
    >>> (cfg.job, cfg.rank, cfg.enabled)
    ('llama', 3, True)
"""

from __future__ import annotations

import os
import socket
import time
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


def _flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _bytes(environ: Mapping[str, str], name: str) -> int | None:
    """A byte count (``8589934592`` or ``8.5e9``); None when unset, malformed or not > 0."""
    value = _float(environ, name, 0.0)
    return int(value) if 0 < value < 2**63 else None


RUN_VARIABLES = ("VIGIL_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")
# Set by launchers: a process with none of these may be one of several ranks.
LAUNCHER_VARIABLES = ("WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "OMPI_COMM_WORLD_SIZE")


def run_key(environ: Mapping[str, str]) -> str | None:
    """This launch's id, the same in every rank of it (``None``: the server decides)."""
    for name in RUN_VARIABLES:
        value = environ.get(name, "").strip()
        if value and value.lower() != "none" and value.isprintable():
            return value[:128]
    if not any(environ.get(name) for name in LAUNCHER_VARIABLES):
        return f"{socket.gethostname()}-{os.getpid()}-{int(time.time())}"[:128]
    return None


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
    run: str | None = None
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
    # Activation swapping (issue 14): run a SwapExecutor that applies ``apply_swap_policy``
    # actions (VIGIL_SWAP=1), and the device memory this rank may use, reported as the
    # heartbeat's ``mem_capacity`` (VIGIL_MEMORY_BUDGET_BYTES; default: the CUDA device's
    # total memory, none on CPU).
    swap: bool = False
    memory_budget_bytes: int | None = None
    # The run's planned step count (VIGIL_TOTAL_STEPS, or init(total_steps=N)): sent once as
    # a ``run_plan`` event, so recovery estimates weigh what is left of the run.
    total_steps: int | None = None

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
            job=job or env.get("VIGIL_JOB") or "default",
            kind=kind or env.get("VIGIL_KIND") or "training",
            rank=rank,
            world_size=world_size,
            local_rank=_int(env, "LOCAL_RANK", 0),
            attempt=_int(env, "TORCHELASTIC_RESTART_COUNT", 0),
            host=env.get("VIGIL_HOSTNAME") or socket.gethostname(),
            run=run_key(env),
            heartbeat_s=max(0.05, _float(env, "VIGIL_HEARTBEAT_S", 1.0)),
            flush_s=max(0.05, _float(env, "VIGIL_FLUSH_S", 1.0)),
            max_batch=max(1, _int(env, "VIGIL_MAX_BATCH", 5000)),
            max_queue=max(100, _int(env, "VIGIL_MAX_QUEUE", 20_000)),
            timeout_s=max(0.1, _float(env, "VIGIL_TIMEOUT_S", 5.0)),
            exit_timeout_s=_float(env, "VIGIL_EXIT_TIMEOUT_S", 2.0),
            opseq_every=max(0, _int(env, "VIGIL_OPSEQ_EVERY", 100)),
            opseq_shapes=_int(env, "VIGIL_OPSEQ_SHAPES", 1) != 0,
            chaos=env.get("VIGIL_CHAOS", ""),
            swap=_flag(env, "VIGIL_SWAP"),
            memory_budget_bytes=_bytes(env, "VIGIL_MEMORY_BUDGET_BYTES"),
            total_steps=max(0, _int(env, "VIGIL_TOTAL_STEPS", 0)) or None,
        )
        known = {k: v for k, v in overrides.items() if k in cls.__dataclass_fields__}
        return replace(cfg, **known) if known else cfg

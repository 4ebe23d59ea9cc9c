"""The profile as arrays: ops (times, phases, layers) and saved storages (bytes, lifetimes).

:func:`parse_profile` checks a PROFILE dict (the contract in :mod:`detectors.swap`) and
folds its saved tensors into storages: views that share one storage count once, with the
earliest producer, the earliest consumer and the latest last use of their tensors.

    >>> prof = {"ops": [{"i": 0, "phase": "forward", "module": "fc1", "start_s": 0.0,
    ...                  "duration_s": 1.0},
    ...                 {"i": 1, "phase": "backward", "module": "fc1", "start_s": 1.0,
    ...                  "duration_s": 1.0}],
    ...         "saved": [{"id": 0, "storage": 0, "bytes": 64, "producer": 0,
    ...                    "consumer": 1, "last_use": 1, "param": False}],
    ...         "param_bytes": 8, "step_s": 2.5}
    >>> p = parse_profile(prof)
    >>> p.n_ops, p.bytes.tolist(), p.consumer.tolist(), p.base_bytes
    (2, [64], [1], 8)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["Profile", "layer_of", "parse_profile"]

I64 = NDArray[np.int64]
F64 = NDArray[np.float64]


@dataclass(frozen=True)
class Profile:
    """One profiled step. Ops ``0..n_ops-1`` in run order; storages ``0..n-1`` in pack order.

    ``consumer`` is -1 for a storage never unpacked; ``movable`` marks storages that may be
    offloaded (not parameters, consumed in backward, at least one byte)."""

    fingerprint: str
    start: F64
    duration: F64
    backward: NDArray[np.bool_]
    module: list[str]
    bytes: I64
    producer: I64
    consumer: I64
    last_use: I64
    param: NDArray[np.bool_]
    base_bytes: int
    step_s: float

    @property
    def n_ops(self) -> int:
        return int(self.start.shape[0])

    @property
    def n_storages(self) -> int:
        return int(self.bytes.shape[0])

    @property
    def movable(self) -> NDArray[np.bool_]:
        return (~self.param) & (self.consumer >= 0) & (self.bytes > 0)

    @property
    def counted(self) -> I64:
        """Bytes per storage that count toward device memory (parameters count in base)."""
        return np.where(self.param, 0, self.bytes).astype(np.int64)


def _num(d: dict[str, Any], key: str, where: str, *, default: float | None = None) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{where}.{key} must be a finite number, not {v!r}")
    return float(v)


def _int(d: dict[str, Any], key: str, where: str, *, low: int, high: int) -> int:
    v = d.get(key)
    if v is None and key == "consumer":
        return -1
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise ValueError(f"{where}.{key} must be an integer in [{low}, {high}], not {v!r}")
    return v


def parse_profile(profile: dict[str, Any]) -> Profile:
    """Check ``profile`` and return its arrays; a ValueError names the first bad field."""
    if not isinstance(profile, dict):
        raise ValueError("profile must be a dict")
    ops = profile.get("ops")
    saved = profile.get("saved")
    if not isinstance(ops, list) or not ops:
        raise ValueError("ops must be a non-empty list")
    if not isinstance(saved, list):
        raise ValueError("saved must be a list")
    n = len(ops)
    start = np.empty(n)
    duration = np.empty(n)
    backward = np.zeros(n, dtype=bool)
    module: list[str] = []
    for i, op in enumerate(ops):
        where = f"ops.{i}"
        if not isinstance(op, dict):
            raise ValueError(f"{where} must be an object")
        start[i] = _num(op, "start_s", where)
        duration[i] = _num(op, "duration_s", where)
        if duration[i] < 0:
            raise ValueError(f"{where}.duration_s must be >= 0")
        backward[i] = op.get("phase") == "backward"
        module.append(str(op.get("module") or ""))
    if np.any(np.diff(start) < 0):
        raise ValueError("ops.start_s must not decrease")

    groups: dict[int, list[int]] = {}  # storage id -> [bytes, producer, consumer, last, param]
    for k, s in enumerate(saved):
        where = f"saved.{k}"
        if not isinstance(s, dict):
            raise ValueError(f"{where} must be an object")
        sid = _int(s, "storage", where, low=0, high=len(saved) - 1)
        nbytes = _int(s, "bytes", where, low=0, high=1 << 62)
        producer = _int(s, "producer", where, low=0, high=n - 1)
        consumer = _int(s, "consumer", where, low=-1, high=n - 1)
        last = _int(s, "last_use", where, low=producer, high=n - 1)
        if consumer >= 0 and not producer < consumer <= last:
            raise ValueError(f"{where}.consumer must lie after producer, up to last_use")
        param = int(bool(s.get("param", False)))
        g = groups.get(sid)
        if g is None:
            groups[sid] = [nbytes, producer, consumer, last, param]
            continue
        if g[0] != nbytes:
            raise ValueError(f"{where}.bytes differs from another tensor of storage {sid}")
        g[1] = min(g[1], producer)
        g[2] = consumer if g[2] < 0 else (g[2] if consumer < 0 else min(g[2], consumer))
        g[3] = max(g[3], last)
        g[4] |= param
    count = max(groups) + 1 if groups else 0
    table = np.zeros((count, 5), dtype=np.int64)
    table[:, 2] = -1
    for sid, g in groups.items():
        table[sid] = g
    base = 0.0
    for key in ("param_bytes", "grad_bytes", "optimizer_bytes"):
        base += _num(profile, key, "profile", default=0)
    step_s = _num(profile, "step_s", "profile", default=float(start[-1] + duration[-1]))
    return Profile(
        fingerprint=str(profile.get("fingerprint", "")),
        start=start,
        duration=duration,
        backward=backward,
        module=module,
        bytes=table[:, 0].copy(),
        producer=table[:, 1].copy(),
        consumer=table[:, 2].copy(),
        last_use=table[:, 3].copy(),
        param=table[:, 4].astype(bool),
        base_bytes=int(base),
        step_s=step_s,
    )


def layer_of(module: str) -> str:
    """The layer a module path belongs to: up to its first numeric part (``blocks.3``), else
    its first part (``fc1``).

    >>> layer_of("blocks.3.attn.qkv"), layer_of("fc1"), layer_of("")
    ('blocks.3', 'fc1', '')
    """
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return parts[0]

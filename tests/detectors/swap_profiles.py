"""Contract-shaped swap profiles (see ``detectors.swap``) built by hand, for the tests.

``chain_profile(n)`` is a chain of ``n`` forward ops, each saving one storage that the mirrored
backward op consumes: op ``k`` saves storage ``k`` and op ``2n - 1 - k`` consumes and frees it.
Every op lasts ``dur`` seconds and starts when the previous one ends.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _op(i: int, phase: str, module: str, dur: float) -> dict[str, Any]:
    return {
        "i": i,
        "name": "aten::mm",
        "phase": phase,
        "module": module,
        "start_s": i * dur,
        "duration_s": dur,
    }


def chain_profile(
    n: int, *, nbytes: int = 100, dur: float = 1.0, base: int = 10, step_s: float | None = None
) -> dict[str, Any]:
    ops = [_op(i, "forward", f"layers.{i}", dur) for i in range(n)]
    ops += [_op(n + j, "backward", f"layers.{n - 1 - j}", dur) for j in range(n)]
    saved = [
        {
            "id": k,
            "storage": k,
            "bytes": nbytes,
            "shape": [nbytes // 4],
            "dtype": "float32",
            "producer": k,
            "consumer": 2 * n - 1 - k,
            "last_use": 2 * n - 1 - k,
            "param": False,
        }
        for k in range(n)
    ]
    return {
        "version": 1,
        "fingerprint": "f" * 32,
        "structure": "s" * 16,
        "device": "cpu",
        "ops": ops,
        "saved": saved,
        "param_bytes": base,
        "grad_bytes": 0,
        "optimizer_bytes": 0,
        "step_s": 2 * n * dur if step_s is None else step_s,
    }


def random_profile(n_ops: int = 10_000, *, seed: int = 0) -> dict[str, Any]:
    """A transformer-like step of ``n_ops`` ops: half forward, half backward, about one saved
    tensor per two forward ops (some views of one storage, some parameters), each consumed by
    the mirrored backward op; op times 5–200 µs, storages 4 KiB–4 MiB."""
    rng = np.random.default_rng(seed)
    fwd = n_ops // 2
    durations = rng.uniform(5e-6, 2e-4, n_ops)
    starts = np.concatenate([[0.0], np.cumsum(durations)[:-1]])
    ops = [
        {
            "i": i,
            "name": "aten::addmm" if i < fwd else "aten::mm",
            "phase": "forward" if i < fwd else "backward",
            "module": f"blocks.{(i if i < fwd else n_ops - 1 - i) * 24 // fwd}.mlp",
            "start_s": float(starts[i]),
            "duration_s": float(durations[i]),
        }
        for i in range(n_ops)
    ]
    saved: list[dict[str, Any]] = []
    storage = -1
    for p in range(fwd):
        if rng.random() > 0.5:
            continue
        views = 3 if rng.random() < 0.1 else 1  # q, k, v cut from one projection
        storage += 1
        param = bool(rng.random() < 0.1)
        nbytes = int(rng.integers(1, 1024)) * 4096
        for _ in range(views):
            consumer = n_ops - 1 - p
            saved.append(
                {
                    "id": len(saved),
                    "storage": storage,
                    "bytes": nbytes,
                    "shape": [nbytes // 4],
                    "dtype": "float32",
                    "producer": p,
                    "consumer": consumer,
                    "last_use": min(n_ops - 1, consumer + int(rng.integers(0, 3))),
                    "param": param,
                }
            )
    return {
        "version": 1,
        "fingerprint": "a" * 32,
        "structure": "b" * 16,
        "device": "cuda",
        "ops": ops,
        "saved": saved,
        "param_bytes": 1 << 20,
        "grad_bytes": 1 << 20,
        "optimizer_bytes": 2 << 20,
        "step_s": float(starts[-1] + durations[-1]),
    }

"""Input handling shared by the detectors: shapes, step ids, rank samples, rounding."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray


def as_2d_float(values: npt.ArrayLike) -> NDArray[np.floating[Any]]:
    """A ``(ranks, steps)`` float array; a 1-D ``(steps,)`` input is one rank."""
    arr = np.asarray(values)
    if not np.issubdtype(arr.dtype, np.floating):
        arr = arr.astype(np.float64)
    if arr.ndim == 1:
        arr = arr[np.newaxis, :]
    if arr.ndim != 2:
        raise ValueError(f"expected a (ranks, steps) array, got shape {arr.shape}")
    return arr


def step_ids(steps: npt.ArrayLike | None, n_steps: int) -> NDArray[np.int64]:
    """The training step of each column: ``steps`` checked, or ``0..n_steps-1``."""
    if steps is None:
        return np.arange(n_steps, dtype=np.int64)
    out = np.asarray(steps, dtype=np.int64).reshape(-1)
    if out.size != n_steps:
        raise ValueError(f"steps has {out.size} entries for {n_steps} columns")
    return out


def sample_rows(n_ranks: int, max_ranks: int) -> NDArray[np.intp]:
    """Evenly spaced row indices, at most ``max_ranks`` of them."""
    return np.unique(np.linspace(0, n_ranks - 1, min(n_ranks, max(1, max_ranks))).astype(np.intp))

"""Collective records → dense per-family arrays, the input of ``detectors.comm``.

Records are aggregated per (rank, step, group, op) — sums over the calls in a step, as the
collector's ``count`` field implies — and arrive as flat parallel arrays (what a SQL query
returns). :func:`families_from_records` groups them into one :class:`CollectiveFamily` per
(group kind, op): every tensor-parallel ``all_reduce``, every data-parallel
``reduce_scatter``, … with dense ``(G, M, S)`` arrays, so the detector's reductions are all
along an axis.

    >>> families, steps = families_from_records(
    ...     rank=[0, 1, 0, 1], step=[5, 5, 6, 6], group=["tp-0"] * 4, op=["all_reduce"] * 4,
    ...     nbytes=[1e6] * 4, duration_s=[0.01, 0.012, 0.01, 0.011],
    ...     members={"tp-0": [0, 1]})
    >>> [(f.name, f.members.tolist(), f.duration_s.shape) for f in families], steps.tolist()
    ([('tp/all_reduce', [[0, 1]], (1, 2, 2))], [5, 6])
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

__all__ = ["CollectiveFamily", "families_from_records", "group_kind"]


@dataclass(frozen=True)
class CollectiveFamily:
    """All groups of one kind running one op, as dense arrays over a window of S steps.

    kind: group kind, e.g. ``"tp"``; op: e.g. ``"all_reduce"``.
    group_names: ``(G,)`` names, e.g. ``("tp-0", "tp-1", …)``.
    members: ``(G, M)`` int global ranks; ``-1`` pads groups smaller than M.
    nbytes: ``(G, S)`` float, bytes the group's collective moved at each step; NaN: unknown.
    duration_s: ``(G, M, S)`` float (float32 is fine and halves the memory traffic), seconds
    each member spent in the collective at each step; NaN where missing.
    """

    kind: str
    op: str
    group_names: tuple[str, ...]
    members: NDArray[np.int64]
    nbytes: NDArray[np.floating[Any]]
    duration_s: NDArray[np.floating[Any]]
    name: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", np.asarray(self.members, dtype=np.int64))
        object.__setattr__(self, "nbytes", _floats(self.nbytes))
        object.__setattr__(self, "duration_s", _floats(self.duration_s))  # float32 stays float32
        n_groups, n_members = self.members.shape
        if len(self.group_names) != n_groups:
            raise ValueError(f"{len(self.group_names)} group names for {n_groups} groups")
        if self.duration_s.shape[:2] != (n_groups, n_members):
            raise ValueError(
                f"duration_s {self.duration_s.shape} vs members {(n_groups, n_members)}"
            )
        if self.nbytes.shape != (n_groups, self.duration_s.shape[2]):
            raise ValueError(f"nbytes {self.nbytes.shape} vs duration_s {self.duration_s.shape}")
        object.__setattr__(self, "name", f"{self.kind}/{self.op}")


def group_kind(name: str) -> str:
    """The kind of a group from its name: ``"tp-3"`` → ``"tp"``, ``"dp_12"`` → ``"dp"``."""
    return re.sub(r"[-_:./]?\d+$", "", name) or name


def families_from_records(
    rank: npt.ArrayLike,
    step: npt.ArrayLike,
    group: npt.ArrayLike,
    op: npt.ArrayLike,
    nbytes: npt.ArrayLike,
    duration_s: npt.ArrayLike,
    *,
    members: Mapping[str, Sequence[int]],
    steps: npt.ArrayLike | None = None,
    kind_of: Mapping[str, str] | None = None,
) -> tuple[list[CollectiveFamily], NDArray[np.int64]]:
    """Dense families from flat per-record arrays, and the ``(S,)`` steps they cover.

    rank, step: ``(N,)`` int; group, op: ``(N,)`` str (group names as in ``members``);
    nbytes, duration_s: ``(N,)`` float, one record per (rank, step, group, op) — summed over
    the calls of a step. members: group name → its ranks (a group missing here gets the ranks
    that reported in it). steps: the window's steps (default: every step seen, sorted).
    kind_of: group name → kind (default :func:`group_kind`). Records of ranks that are not
    members, or of steps outside ``steps``, are dropped. Cost: about 1 µs per record, mostly
    string handling; a backend with millions of records a window can fill the dense arrays
    from integer ids itself.

    >>> fams, steps = families_from_records([0, 1], [7, 7], ["tp-0", "tp-0"],
    ...     ["all_reduce"] * 2, [1e6, 1e6], [0.01, 0.012], members={"tp-0": [0, 1]})
    >>> fams[0].name, fams[0].duration_s.shape, steps.tolist()
    ('tp/all_reduce', (1, 2, 1), [7])
    """
    rank_a = np.asarray(rank, dtype=np.int64).reshape(-1)
    step_a = np.asarray(step, dtype=np.int64).reshape(-1)
    bytes_a = np.asarray(nbytes, dtype=np.float64).reshape(-1)
    dur_a = np.asarray(duration_s, dtype=np.float64).reshape(-1)
    names, group_code = _factorize(group)
    op_names, op_code = _factorize(op)
    step_ids = np.unique(step_a) if steps is None else np.asarray(steps, dtype=np.int64).reshape(-1)
    n_steps = step_ids.size

    # Members of every group seen, as a padded (n_groups, M) table sorted within each row.
    member_lists = [
        np.unique(np.asarray(members[g], dtype=np.int64))
        if g in members
        else np.unique(rank_a[group_code == i])
        for i, g in enumerate(names)
    ]
    width = max((m.size for m in member_lists), default=0)
    table = np.full((len(names), width), -1, dtype=np.int64)
    for i, m in enumerate(member_lists):
        table[i, : m.size] = m

    # Row → (member slot, step column); drop records that fit neither.
    order = np.argsort(step_ids)
    pos = np.clip(np.searchsorted(step_ids, step_a, sorter=order), 0, max(n_steps - 1, 0))
    col = order[pos] if n_steps else pos
    ok = (step_ids[col] == step_a) if n_steps else np.zeros(step_a.size, dtype=bool)
    slot = _member_slot(table, group_code, rank_a)
    ok &= slot >= 0

    kinds = [(kind_of or {}).get(g) or group_kind(g) for g in names]
    families: list[CollectiveFamily] = []
    for o, op_name in enumerate(op_names):
        for kind in sorted(set(kinds)):
            gids = np.array([i for i, k in enumerate(kinds) if k == kind], dtype=np.int64)
            local = np.full(len(names), -1, dtype=np.int64)
            local[gids] = np.arange(gids.size)
            sel = ok & (op_code == o) & (local[group_code] >= 0)
            if not sel.any():
                continue
            fam_members = table[gids]
            m_width = int((fam_members >= 0).sum(axis=1).max())
            dur = np.full((gids.size, m_width, n_steps), np.nan)
            byt = np.full((gids.size, n_steps), np.nan)
            gi, si, mi = local[group_code[sel]], col[sel], slot[sel]
            dur[gi, mi, si] = dur_a[sel]
            byt[gi, si] = bytes_a[sel]
            families.append(
                CollectiveFamily(
                    kind=kind,
                    op=op_name,
                    group_names=tuple(names[i] for i in gids),
                    members=fam_members[:, :m_width],
                    nbytes=byt,
                    duration_s=dur,
                )
            )
    return families, step_ids


def _factorize(values: npt.ArrayLike) -> tuple[list[str], NDArray[np.intp]]:
    """Distinct strings (sorted), and each value's index among them."""
    arr = np.asarray(values).reshape(-1)
    if arr.dtype.kind not in "US":
        arr = arr.astype(str)
    names = np.array(sorted(set(arr.tolist())), dtype=arr.dtype)
    return [str(n) for n in names], np.searchsorted(names, arr).astype(np.intp)


def _member_slot(
    table: NDArray[np.int64], group_code: NDArray[np.intp], rank: NDArray[np.int64]
) -> NDArray[np.intp]:
    """Column of ``rank`` in row ``group_code`` of the sorted member table, or -1."""
    if table.size == 0:
        return np.full(rank.size, -1, dtype=np.intp)
    stride = int(max(table.max(), rank.max(initial=0))) + 2
    keys = (np.arange(table.shape[0])[:, None] * stride + (table + 1)).ravel()  # padding: +0
    order = np.argsort(keys, kind="stable")
    want = group_code.astype(np.int64) * stride + (rank + 1)
    pos = np.clip(np.searchsorted(keys, want, sorter=order), 0, keys.size - 1)
    hit = (keys[order[pos]] == want) & (rank >= 0)
    return np.where(hit, order[pos] % table.shape[1], -1).astype(np.intp)


# --- small helpers --------------------------------------------------------------------------


def _floats(values: npt.ArrayLike) -> NDArray[np.floating[Any]]:
    arr = np.asarray(values)
    return arr if np.issubdtype(arr.dtype, np.floating) else arr.astype(np.float64)

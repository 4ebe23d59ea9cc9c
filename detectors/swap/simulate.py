"""Replay a profile under a policy: peak device memory, exposed transfer time, step time.

The memory model (shared with the executor, ``collector/integrations/swap.py``): device
bytes = parameters + gradients + optimizer state + every saved storage resident now. A
storage arrives when its producer op has run; an offloaded one leaves when its copy out
ends, comes back when its prefetch is issued, and is freed after its last use. Copies go
through one engine each way (device→host and host→device are two FIFO queues), at
``bandwidth_bytes_per_s``; a copy back waits for the copy out. A backward op waits for
the prefetches of the storages it consumes; the wait is *exposed* transfer time and adds to
the step. Recomputed storages leave at once and come back at their ``at`` op, whose
start is delayed by ``cost_s``.

Memory is sampled at events, ordered by op, then within an op: copies out that ended
before it started, prefetches issued before it, storages it saved (each one's own copy out,
when that took no time, right after it), storages freed after it. With infinite bandwidth
this is exactly the order the executor sees on CPU, where copies are synchronous.

    >>> from detectors.swap.model import parse_profile
    >>> ops = [{"start_s": float(i), "duration_s": 1.0, "phase": "forward" if i < 2
    ...         else "backward"} for i in range(4)]
    >>> saved = [{"storage": 0, "bytes": 100, "producer": 0, "consumer": 3, "last_use": 3},
    ...          {"storage": 1, "bytes": 100, "producer": 1, "consumer": 2, "last_use": 2}]
    >>> prof = {"ops": ops, "saved": saved, "param_bytes": 10}
    >>> simulate(prof, None, bandwidth_bytes_per_s=100.0)
    SimResult(peak_bytes=210, exposed_s=0.0, step_s=4.0, recompute_s=0.0)
    >>> pol = {"offload": [{"storage": 0, "prefetch_at": 3}]}
    >>> simulate(prof, pol, bandwidth_bytes_per_s=100.0)  # 1 s back, needed at once
    SimResult(peak_bytes=210, exposed_s=1.0, step_s=5.0, recompute_s=0.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from detectors.swap.model import I64, Profile, layer_of, parse_profile
from detectors.swap.schedule import alap_prefetch

__all__ = ["Plan", "SimResult", "baselines", "parse_policy", "run_plan", "simulate"]


@dataclass(frozen=True)
class SimResult:
    peak_bytes: int
    exposed_s: float  # time ops waited for prefetches
    step_s: float  # the profiled step time plus every wait and recomputation
    recompute_s: float = 0.0


@dataclass(frozen=True)
class Plan:
    """A policy as arrays: offloaded storages with their prefetch op, recomputed ones."""

    off: I64
    prefetch_at: I64
    rec: I64
    rec_at: I64
    rec_cost: NDArray[np.float64]

    @staticmethod
    def offload(off: I64, prefetch_at: I64) -> Plan:
        empty = np.zeros(0, dtype=np.int64)
        return Plan(off, prefetch_at, empty, empty, np.zeros(0))


NOTHING = Plan.offload(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def _check_bandwidth(bw: float) -> float:
    if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not bw > 0:
        raise ValueError(f"bandwidth_bytes_per_s must be > 0, not {bw!r}")
    return float(bw)


def _entry_int(e: dict[str, Any], key: str, where: str, low: int, high: int, default: int) -> int:
    v = e.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise ValueError(f"{where}.{key} must be an integer in [{low}, {high}], not {v!r}")
    return v


def parse_policy(p: Profile, policy: dict[str, Any] | None) -> Plan:
    """Check a POLICY against the profile it is replayed on; a ValueError names the field."""
    if policy is None:
        return NOTHING
    if not isinstance(policy, dict):
        raise ValueError("policy must be a dict")
    seen: set[int] = set()
    cols: dict[str, list[Any]] = {"off": [], "pa": [], "rec": [], "at": [], "cost": []}
    for part in ("offload", "recompute"):
        entries = policy.get(part, [])
        if not isinstance(entries, list):
            raise ValueError(f"{part} must be a list")
        for k, e in enumerate(entries):
            where = f"{part}.{k}"
            if not isinstance(e, dict):
                raise ValueError(f"{where} must be an object")
            s = _entry_int(e, "storage", where, 0, p.n_storages - 1, -1)
            if s in seen or not p.movable[s]:
                raise ValueError(f"{where}.storage {s} is repeated, a parameter or never used")
            seen.add(s)
            if e.get("bytes", p.bytes[s]) != p.bytes[s]:
                raise ValueError(f"{where}.bytes does not match storage {s} of the profile")
            lo, hi = int(p.producer[s]) + 1, int(p.consumer[s])
            if part == "offload":
                cols["off"].append(s)
                cols["pa"].append(_entry_int(e, "prefetch_at", where, lo, hi, hi))
            else:
                cols["rec"].append(s)
                cols["at"].append(_entry_int(e, "at", where, lo, hi, hi))
                cost = e.get("cost_s", 0.0)
                if isinstance(cost, bool) or not isinstance(cost, (int, float)) or cost < 0:
                    raise ValueError(f"{where}.cost_s must be a number >= 0")
                cols["cost"].append(float(cost))
    return Plan(
        np.array(cols["off"], dtype=np.int64),
        np.array(cols["pa"], dtype=np.int64),
        np.array(cols["rec"], dtype=np.int64),
        np.array(cols["at"], dtype=np.int64),
        np.array(cols["cost"], dtype=np.float64),
    )


def simulate(
    profile: dict[str, Any], policy: dict[str, Any] | None, *, bandwidth_bytes_per_s: float
) -> SimResult:
    """Replay ``profile`` under ``policy`` (None: nothing offloaded)."""
    bw = _check_bandwidth(bandwidth_bytes_per_s)
    p = parse_profile(profile)
    return run_plan(p, parse_policy(p, policy), bw)[0]


def baselines(profile: dict[str, Any], bandwidth_bytes_per_s: float) -> dict[str, SimResult]:
    """The three reference points: nothing offloaded; every movable storage offloaded (each
    prefetched as late as hides its copy, as :func:`detectors.swap.generate` does); and
    activation checkpointing at every layer (``blocks.3``: a module path up to its first
    number), which keeps each layer's first saved storage and recomputes the rest at the
    layer's first backward op, at the cost of the layer's forward time."""
    bw = _check_bandwidth(bandwidth_bytes_per_s)
    p = parse_profile(profile)
    off = np.flatnonzero(p.movable)
    return {
        "no offload": run_plan(p, NOTHING, bw)[0],
        "offload everything": run_plan(p, Plan.offload(off, alap_prefetch(p, off, bw)), bw)[0],
        "checkpoint every layer": run_plan(p, _checkpoint_layers(p), bw)[0],
    }


def _checkpoint_layers(p: Profile) -> Plan:
    layers = [layer_of(m) for m in p.module]
    fwd_time: dict[str, float] = {}
    for i, name in enumerate(layers):
        if not p.backward[i]:
            fwd_time[name] = fwd_time.get(name, 0.0) + float(p.duration[i])
    by_layer: dict[str, list[int]] = {}
    for s in np.flatnonzero(p.movable).tolist():
        by_layer.setdefault(layers[int(p.producer[s])], []).append(s)
    rec: list[int] = []
    at: list[int] = []
    cost: list[float] = []
    for name, ids in by_layer.items():
        dropped = ids[1:]  # the first saved storage stands for the layer's input: kept
        if not dropped:
            continue
        first = min(int(p.consumer[s]) for s in dropped)
        for k, s in enumerate(dropped):
            rec.append(s)
            at.append(max(first, int(p.producer[s]) + 1))
            cost.append(fwd_time.get(name, 0.0) if k == 0 else 0.0)
    empty = np.zeros(0, dtype=np.int64)
    return Plan(empty, empty, np.array(rec, np.int64), np.array(at, np.int64), np.array(cost))


def run_plan(
    p: Profile, plan: Plan, bw: float, *, curve: bool = False
) -> tuple[SimResult, NDArray[np.int64] | None]:
    """Simulate; with ``curve`` also return the peak device bytes during each op."""
    n = p.n_ops
    nbytes = p.counted
    copy_s = nbytes / bw if math.isfinite(bw) else np.zeros(p.n_storages)
    inc = np.zeros(n)  # delay added at each op (waits + recomputation)
    d2h_done = np.zeros(p.n_storages)
    h2d_done = np.zeros(p.n_storages)
    off, pa = plan.off, plan.prefetch_at
    # Issue order: by prefetch op, then the storage needed first.
    order = np.lexsort((off, p.consumer[off], pa)) if off.size else off
    off, pa = off[order], pa[order]
    by_pa: dict[int, list[int]] = {}
    for s, q in zip(off.tolist(), pa.tolist(), strict=True):
        by_pa.setdefault(q, []).append(s)
    by_prod: dict[int, list[int]] = {}
    for s in sorted(off.tolist()):
        by_prod.setdefault(int(p.producer[s]), []).append(s)
    by_cons: dict[int, list[int]] = {}
    for s in off.tolist():
        by_cons.setdefault(int(p.consumer[s]), []).append(s)
    rec_cost: dict[int, float] = {}
    for q, c in zip(plan.rec_at.tolist(), plan.rec_cost.tolist(), strict=True):
        rec_cost[q] = rec_cost.get(q, 0.0) + c
    delay = exposed = 0.0
    d2h_free = h2d_free = 0.0
    start, dur = p.start, p.duration
    for i in sorted(set(by_pa) | set(by_prod) | set(by_cons) | set(rec_cost)):
        d = float(start[i]) + delay  # when op i would start
        for s in by_pa.get(i, ()):
            h2d_free = max(d, h2d_free, float(d2h_done[s])) + float(copy_s[s])
            h2d_done[s] = h2d_free
        ready = max([d] + [float(h2d_done[s]) for s in by_cons.get(i, ())])
        exposed += ready - d
        inc[i] = ready - d + rec_cost.get(i, 0.0)
        delay += float(inc[i])
        end = float(start[i]) + delay + float(dur[i])
        for s in by_prod.get(i, ()):
            d2h_free = max(end, d2h_free) + float(copy_s[s])
            d2h_done[s] = d2h_free
    s_start = start + np.cumsum(inc)
    s_end = s_start + dur
    result = SimResult(
        peak_bytes=0,
        exposed_s=exposed,
        step_s=p.step_s + delay,
        recompute_s=float(plan.rec_cost.sum()),
    )
    return _memory(p, plan, off, pa, d2h_done, s_start, s_end, result, curve)


def _memory(
    p: Profile,
    plan: Plan,
    off: I64,
    pa: I64,
    d2h_done: NDArray[np.float64],
    s_start: NDArray[np.float64],
    s_end: NDArray[np.float64],
    result: SimResult,
    curve: bool,
) -> tuple[SimResult, NDArray[np.int64] | None]:
    nbytes = p.counted
    live = np.flatnonzero(nbytes > 0)
    ops = [p.producer[live], p.last_use[live]]
    subs = [np.full(live.size, 2), np.full(live.size, 3)]
    seqs = [2 * live, live]
    deltas = [nbytes[live], -nbytes[live]]
    # Offloaded: leaves when its copy out ends (before the first op starting after that),
    # unless its prefetch comes first; then it never leaves.
    prod = p.producer[off]
    instant = d2h_done[off] <= s_end[prod]
    j = np.searchsorted(s_start, d2h_done[off], side="left")
    out_op = np.where(instant, prod, j)
    out_sub = np.where(instant, 2, 0)
    leaves = out_op * 4 + out_sub < pa * 4 + 1
    # Recomputed: leaves right after it is saved, rebuilt before its ``at`` op.
    rec = plan.rec
    for idx, o_op, o_sub, back, issued in (
        (off[leaves], out_op[leaves], out_sub[leaves], pa[leaves], np.flatnonzero(leaves)),
        (rec, p.producer[rec], np.full(rec.size, 2), plan.rec_at, off.size + np.arange(rec.size)),
    ):
        ops += [o_op, back]
        subs += [o_sub, np.ones(idx.size, dtype=np.int64)]
        seqs += [np.where(o_sub == 2, 2 * idx + 1, idx), issued]
        deltas += [-nbytes[idx], nbytes[idx]]
    op = np.concatenate(ops).astype(np.int64)
    key = op * 4 + np.concatenate(subs)
    seq = np.concatenate(seqs)
    delta = np.concatenate(deltas).astype(np.int64)
    order = np.lexsort((seq, key))
    level = np.cumsum(delta[order])
    peak = p.base_bytes + max(0, int(level.max()) if level.size else 0)
    result = SimResult(peak, result.exposed_s, result.step_s, result.recompute_s)
    if not curve:
        return result, None
    return result, _op_curve(p.n_ops, op[order], level) + p.base_bytes


def _op_curve(n: int, op: I64, level: I64) -> I64:
    """Highest level during each op: the level it starts with or any level inside it."""
    inside = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(inside, op, level)
    last = np.zeros(n, dtype=np.int64)
    has = np.zeros(n, dtype=bool)
    ends = np.flatnonzero(np.append(op[1:] != op[:-1], True)) if op.size else op
    last[op[ends]] = level[ends]
    has[op[ends]] = True
    carried = np.where(has, np.arange(n), 0)
    np.maximum.accumulate(carried, out=carried)
    after = np.where(has[carried], last[carried], 0)  # level after op i's events
    entering = np.concatenate([np.zeros(1, dtype=np.int64), after[:-1]])
    result: I64 = np.maximum(inside, entering)
    return result

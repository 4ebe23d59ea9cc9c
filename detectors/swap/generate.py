"""The policy generator: fit a step into a memory budget with the least exposed transfer time.

Greedy, checked by the simulator (:mod:`detectors.swap.simulate`), in rounds:

1. Replay the step with nothing offloaded. Within budget: the policy offloads nothing
   (no transfer can beat that).
2. Rank the movable storages (not parameters, consumed in backward) by Capuchin's free
   time: the time between the end of the producer and the start of the consumer, less the
   copy out and the copy back. The longest idle first: its copies hide most easily.
3. Walk the ranking against the simulated per-op memory curve: a storage is taken when the
   ops it would be away for (from the op after its copy out ends to the op before its
   estimated prefetch) include one still over budget; that window is then lowered by its
   bytes. Stop when no op is over.
4. Schedule the prefetches of everything taken as late as still hides each copy, one copy
   engine each way (:func:`detectors.swap.schedule.alap_prefetch`), and simulate exactly.
   Still over budget (queued copies come back earlier than estimated): another round from
   the exact curve. At most ``MAX_ROUNDS`` rounds.

When even the best plan found exceeds the budget, the policy says so: ``"feasible": false``
with the best peak reached (searched again with that peak as the budget, for the plan that
reaches it with the least exposed time). Cost: O(S log S) per simulation, O(S·N) numpy work for the
walk (S storages, N ops), about 0.1 s for 10,000 ops (``bench/swap_policy.py``).

    >>> ops = [{"start_s": float(i), "duration_s": 1.0} for i in range(6)]
    >>> saved = [{"storage": k, "bytes": 100, "producer": k, "consumer": 5 - k,
    ...           "last_use": 5 - k} for k in range(3)]
    >>> prof = {"fingerprint": "f00d", "ops": ops, "saved": saved, "param_bytes": 10}
    >>> generate(prof, budget_bytes=400, bandwidth_bytes_per_s=1e3)["offload"]
    []
    >>> pol = generate(prof, budget_bytes=50, bandwidth_bytes_per_s=1e3, version=4)
    >>> pol["version"], pol["feasible"], pol["predicted_peak_bytes"] > 50
    (4, False, True)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from detectors.swap.model import I64, Profile, parse_profile
from detectors.swap.schedule import alap_prefetch, triggers
from detectors.swap.simulate import NOTHING, Plan, SimResult, _check_bandwidth, run_plan

__all__ = ["MAX_ROUNDS", "generate", "offload_everything"]

MAX_ROUNDS = 8


def generate(
    profile: dict[str, Any], *, budget_bytes: int, bandwidth_bytes_per_s: float, version: int = 1
) -> dict[str, Any]:
    """A POLICY for ``profile`` under ``budget_bytes`` of device memory."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
        raise ValueError(f"budget_bytes must be an integer >= 0, not {budget_bytes!r}")
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"version must be an integer >= 0, not {version!r}")
    bw = _check_bandwidth(bandwidth_bytes_per_s)
    p = parse_profile(profile)
    plan, result = _search(p, budget_bytes, bw)
    if result.peak_bytes > budget_bytes:  # the least exposed plan that reaches that peak
        plan2, result2 = _search(p, result.peak_bytes, bw)
        if _better(result2, result, result.peak_bytes):
            plan, result = plan2, result2
    return _policy(p, plan, result, budget_bytes, bw, version)


def offload_everything(
    profile: dict[str, Any], *, bandwidth_bytes_per_s: float, version: int = 1
) -> dict[str, Any]:
    """The baseline as a POLICY: every movable storage offloaded, each prefetched as late as
    hides its copy (its budget is the peak it reaches)."""
    bw = _check_bandwidth(bandwidth_bytes_per_s)
    p = parse_profile(profile)
    off = np.flatnonzero(p.movable)
    plan = Plan.offload(off, alap_prefetch(p, off, bw))
    result = run_plan(p, plan, bw)[0]
    return _policy(p, plan, result, result.peak_bytes, bw, version)


def _policy(
    p: Profile, plan: Plan, result: SimResult, budget_bytes: int, bw: float, version: int
) -> dict[str, Any]:
    return {
        "version": version,
        "fingerprint": p.fingerprint,
        "budget_bytes": budget_bytes,
        "bandwidth_bytes_per_s": bw,
        "feasible": result.peak_bytes <= budget_bytes,
        "offload": [
            {"storage": s, "bytes": int(p.bytes[s]), "prefetch_at": q}
            for s, q in sorted(zip(plan.off.tolist(), plan.prefetch_at.tolist(), strict=True))
        ],
        "recompute": [],
        "predicted_peak_bytes": result.peak_bytes,
        "predicted_exposed_s": result.exposed_s,
        "predicted_step_s": result.step_s,
        "storage_bytes": p.bytes.tolist(),
        "consumers": p.consumer.tolist(),
        "params": np.flatnonzero(p.param).tolist(),
        "base_bytes": p.base_bytes,
    }


def _better(a: SimResult, b: SimResult, budget: int) -> bool:
    """Is ``a`` a better outcome than ``b``: within budget, then less exposed; else lower."""
    a_fits, b_fits = a.peak_bytes <= budget, b.peak_bytes <= budget
    if a_fits != b_fits:
        return a_fits
    if a_fits:
        return (a.exposed_s, a.peak_bytes) < (b.exposed_s, b.peak_bytes)
    return (a.peak_bytes, a.exposed_s) < (b.peak_bytes, b.exposed_s)


def _search(p: Profile, budget: int, bw: float) -> tuple[Plan, SimResult]:
    result, curve = run_plan(p, NOTHING, bw, curve=True)
    if result.peak_bytes <= budget or curve is None:
        return NOTHING, result
    best_plan, best = NOTHING, result
    cand, lo, hi = _candidates(p, bw)
    taken = np.zeros(p.n_storages, dtype=bool)
    for _ in range(MAX_ROUNDS):
        over = curve - budget
        added = False
        for s, a, b in zip(cand.tolist(), lo.tolist(), hi.tolist(), strict=True):
            if taken[s] or b <= a or over[a:b].max() <= 0:
                continue
            taken[s] = added = True
            over[a:b] -= p.bytes[s]
            if over.max() <= 0:
                break
        if not added:
            break
        off = np.flatnonzero(taken)
        plan = Plan.offload(off, alap_prefetch(p, off, bw))
        result, curve = run_plan(p, plan, bw, curve=True)
        if _better(result, best, budget):
            best_plan, best = plan, result
        if result.peak_bytes <= budget or curve is None:
            break
    return best_plan, best


def _candidates(p: Profile, bw: float) -> tuple[I64, I64, I64]:
    """Movable storages, longest free time first, each with the ops ``[lo, hi)`` it would be
    away for if it alone were offloaded."""
    s = np.flatnonzero(p.movable)
    copy_s = p.bytes[s] / bw if math.isfinite(bw) else np.zeros(s.size)
    prod, cons = p.producer[s], p.consumer[s]
    end = p.start[prod] + p.duration[prod]
    free = p.start[cons] - end - 2 * copy_s
    order = np.lexsort((s, -p.bytes[s], -free))
    s, copy_s, prod, cons, end = s[order], copy_s[order], prod[order], cons[order], end[order]
    # Away from the first op starting after its copy out ends (the op after the producer
    # when the copy takes no time) ...
    lo = np.maximum(np.searchsorted(p.start, end + copy_s, side="left"), prod + 1)
    lo = np.where(copy_s == 0, prod + 1, lo)
    # ... until the latest trigger that still hides the copy back.
    trig = triggers(p)
    q = np.searchsorted(p.start[trig], p.start[cons] - copy_s, side="right") - 1
    hi = np.minimum(trig[np.maximum(q, 0)], cons)
    return s.astype(np.int64), lo.astype(np.int64), hi.astype(np.int64)

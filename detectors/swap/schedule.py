"""When to issue each prefetch: as late as still hides its copy, one copy engine.

Prefetches are issued when the executor unpacks a saved tensor (Capuchin's "in-trigger": a
tensor access earlier than the one that needs the data), so a prefetch op is always the
first consumer of some storage. :func:`alap_prefetch` walks the offloaded storages from the
last consumed to the first; each copy must end before its consumer starts and before the
next copy on the engine begins, and is issued at the latest trigger that starts no later
than the copy must. A storage the first backward op consumes cannot be fetched ahead.

    >>> from detectors.swap.model import parse_profile
    >>> ops = [{"start_s": float(i), "duration_s": 1.0} for i in range(6)]
    >>> saved = [{"storage": k, "bytes": 100, "producer": k, "consumer": 5 - k,
    ...           "last_use": 5 - k} for k in range(3)]
    >>> p = parse_profile({"ops": ops, "saved": saved})
    >>> alap_prefetch(p, np.array([0, 1]), 100.0).tolist()  # 1 s copies, serialised
    [4, 3]
"""

from __future__ import annotations

import math

import numpy as np

from detectors.swap.model import I64, Profile

__all__ = ["alap_prefetch", "triggers"]


def triggers(p: Profile) -> I64:
    """Ops at which the executor can issue prefetches: first consumers of any storage."""
    return np.unique(p.consumer[p.consumer >= 0])


def alap_prefetch(p: Profile, off: I64, bw: float) -> I64:
    """The prefetch op of each storage in ``off`` (same order)."""
    trig = triggers(p)
    t_start = p.start[trig]
    copy_s = p.bytes / bw if math.isfinite(bw) else np.zeros(p.n_storages)
    result = np.zeros(off.size, dtype=np.int64)
    head = math.inf  # when the copy scheduled after this one must start
    for k in np.lexsort((-off, -p.consumer[off])).tolist():
        s = int(off[k])
        c = int(p.consumer[s])
        finish = min(float(p.start[c]), head)
        begin = finish - float(copy_s[s])
        upto = int(np.searchsorted(trig, c, side="right"))  # triggers <= c
        q = int(np.searchsorted(t_start[:upto], begin, side="right")) - 1
        at = int(trig[max(q, 0)])
        result[k] = at if at > p.producer[s] else c
        head = begin
    return result

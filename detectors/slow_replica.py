"""Slow replicas and queue build-up in a serving fleet, from per-replica minute rollups.

    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> n = rng.poisson(40, size=(3, 60)).astype(float)          # 3 replicas, 60 minutes
    >>> ttft = rng.lognormal(np.log(0.3), 0.1, size=(3, 60))
    >>> ttft[2, 30:] *= 2.0                                       # replica c turns 2x slow
    >>> [f] = detect_slow_replicas(("a", "b", "c"), np.arange(60), ttft * n, n)
    >>> f.key, f.first_step, f.active, round(f.evidence["ttft"]["ratio"], 1)
    ('slow_replica:c', 30, True, 1.9)

**Slow replica** (the serving analogue of the straggler). For each metric (mean TTFT and
mean TPOT per replica-minute, ``sum / n``):

1. A replica-minute counts only with at least ``min_requests`` requests for the metric, so
   idle and nearly idle minutes are ignored (neither slow nor normal).
2. Per minute, each replica's ratio to its peers: with ≥ 3 replicas counting, its mean over
   the cross-replica median (robust to one slow replica among three); with exactly 2, its
   mean over the other's (the pair test, with the stricter ``pair_threshold``).
3. Noise: the log-ratios' minute-to-minute changes, per replica, ``1.4826 · MAD / √2``, then
   the median over replicas (each replica's own step at an onset is one change among many,
   and one slow replica does not move the median), at least ``scale_floor``.
4. A replica-minute is *slow* when its ratio is ≥ ``1 + rel_threshold`` (1.5x) and its
   log-ratio ≥ ``z_threshold`` noise units.
5. Persistence: a replica fires while ≥ ``persist_k`` of its last ``persist_m`` counted
   minutes are slow (idle minutes are skipped, not counted as recovered). The onset is the
   first slow minute of the run that first met the rule. The episode is ``active`` when it
   still fires at the replica's last counted minute and that minute is among the window's
   last ``persist_m``. A replica that stopped serving resolves: once it has served no request
   at all in ``gone_after`` (2) minutes that its peers served since its last counted minute
   (it left the rotation; a merely quiet replica still serves a few), else when its last
   counted minute leaves the window's last ``persist_m``.

One finding per replica (kind ``slow_replica``, key ``slow_replica:<replica>``, ``ranks=()``),
with TTFT and/or TPOT evidence; ``critical`` from ``critical_ratio``. ``first_step`` and
``last_step`` are epoch minutes.

**Queue build-up** (kind ``queue_buildup``, key ``queue_buildup:<model>``; replicas named
``model/replica`` form one fleet per model). Requests are reported when they end, so a
minute's ``arrivals`` are only complete once every request that arrived in it has finished:
exactly when a queue grows, recent arrivals are undercounted, and arrivals against
completions cannot decide. The detector therefore watches the wait itself: the fleet's mean
``queue_s`` per minute (the mean TTFT when the fleet does not report ``queue_s`` in most
minutes), over minutes with ≥ ``min_requests``. It fires when, over the last ``span``
counted minutes, the wait's trend (the Theil–Sen slope, robust to a noisy minute) rose by
at least ``rise_rel`` of its starting value and ``rise_s``, and the wait is ≥ ``growth`` × its
baseline (the 25th percentile of the ``baseline`` counted minutes before) and
``min_increase_s`` above it. It stays firing while the trend still rises at half that rate,
and ends after ``span`` minutes that do not. A queue that stops growing, even at a high
level, resolves (its latency then shows in SLO burn). The last minutes' arrivals and
completions are in the evidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from detectors.finding import Finding, Severity
from detectors.registry import register
from detectors.robust import MAD_TO_SIGMA, nanmedian_rows
from detectors.window import ServingWindow, Window

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

__all__ = [
    "QueueConfig",
    "SlowReplicaConfig",
    "detect_queue_buildup",
    "detect_slow_replicas",
]


@dataclass(frozen=True)
class SlowReplicaConfig:
    min_requests: int = 5
    rel_threshold: float = 0.5
    pair_threshold: float = 0.75
    z_threshold: float = 3.0
    scale_floor: float = 0.05
    persist_k: int = 3
    persist_m: int = 5
    critical_ratio: float = 2.0
    gone_after: int = 2

    def __post_init__(self) -> None:
        if self.min_requests < 1 or not 1 <= self.persist_k <= self.persist_m:
            raise ValueError("need min_requests >= 1 and 1 <= persist_k <= persist_m")
        if self.gone_after < 1:
            raise ValueError("need gone_after >= 1")
        if self.rel_threshold <= 0 or self.pair_threshold <= 0 or self.scale_floor <= 0:
            raise ValueError("thresholds and scale_floor must be > 0")


@dataclass(frozen=True)
class QueueConfig:
    min_requests: int = 5
    span: int = 5
    baseline: int = 30
    min_baseline: int = 5
    growth: float = 2.0
    min_increase_s: float = 1.0
    rise_rel: float = 0.2
    rise_s: float = 0.5

    def __post_init__(self) -> None:
        if self.span < 3 or self.min_baseline < 1 or self.baseline < self.min_baseline:
            raise ValueError("need span >= 3 and baseline >= min_baseline >= 1")


def _means(sums: npt.ArrayLike, counts: npt.ArrayLike, min_n: int) -> FloatArray:
    s, n = np.asarray(sums, dtype=np.float64), np.asarray(counts, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.where(n >= min_n, s / n, np.nan), dtype=np.float64)


def _log_ratios(x: FloatArray) -> tuple[FloatArray, npt.NDArray[np.int64]]:
    """Per replica-minute: log(mean / peers); per minute: the replicas counting."""
    valid = np.isfinite(x) & (x > 0)
    x = np.where(valid, x, np.nan)
    count = valid.sum(axis=0)
    med = nanmedian_rows(x.T)  # (M,)
    other = np.nansum(x, axis=0)[np.newaxis, :] - x  # the other one, for pairs
    peers = np.where(count[np.newaxis, :] == 2, other, med[np.newaxis, :])
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(valid & (count[np.newaxis, :] >= 2), np.log(x / peers), np.nan)
    return y, count


def _noise(y: FloatArray, floor: float) -> float:
    scales = []
    for row in y:
        v = row[np.isfinite(row)]
        if v.size >= 3:
            scales.append(MAD_TO_SIGMA * float(np.median(np.abs(np.diff(v)))) / np.sqrt(2))
    return max(float(np.median(scales)) if scales else floor, floor)


def _episodes(slow: BoolArray, counted: BoolArray, k: int, m: int) -> list[tuple[int, int, int]]:
    """(onset, last slow, last firing) minute indices of each run of firing, over counted
    minutes only; runs less than ``m`` counted minutes apart are one episode."""
    where = np.flatnonzero(counted)
    flags = slow[where].astype(np.int64)
    cs = np.concatenate(([0], np.cumsum(flags)))
    pos = np.arange(where.size)
    fire = np.concatenate(([False], (cs[pos + 1] - cs[np.maximum(pos + 1 - m, 0)]) >= k, [False]))
    starts = np.flatnonzero(fire[1:] & ~fire[:-1])
    ends = np.flatnonzero(fire[:-1] & ~fire[1:]) - 1  # inclusive
    runs: list[list[int]] = []
    for i, j in zip(starts.tolist(), ends.tolist(), strict=True):
        if runs and i - runs[-1][1] <= m:
            runs[-1][1] = j
        else:
            runs.append([i, j])
    out = []
    for i, j in runs:
        lo = max(i + 1 - m, 0)
        onset = lo + int(np.flatnonzero(flags[lo : i + 1])[0])
        last = j - int(np.flatnonzero(flags[i : j + 1][::-1])[0])
        out.append((int(where[onset]), int(where[last]), int(where[j])))
    return out


def _num(x: float) -> float | None:
    return None if not np.isfinite(x) else float(f"{x:.4g}")


def detect_slow_replicas(
    replicas: Sequence[str],
    minutes: npt.ArrayLike,
    ttft_sum: npt.ArrayLike,
    ttft_n: npt.ArrayLike,
    tpot_sum: npt.ArrayLike | None = None,
    tpot_n: npt.ArrayLike | None = None,
    config: SlowReplicaConfig | None = None,
) -> list[Finding]:
    """Slow-replica findings from ``(P, M)`` sums and counts (see the module docstring)."""
    cfg = config or SlowReplicaConfig()
    mins = np.asarray(minutes, dtype=np.int64).reshape(-1)
    metrics = {"ttft": (ttft_sum, ttft_n)}
    if tpot_sum is not None and tpot_n is not None:
        metrics["tpot"] = (tpot_sum, tpot_n)
    per_replica: dict[int, dict[str, Any]] = {}
    for name, (sums, counts) in metrics.items():
        x = _means(sums, counts, cfg.min_requests)
        if x.shape != (len(replicas), mins.size):
            raise ValueError(f"{name}: expected ({len(replicas)}, {mins.size}), got {x.shape}")
        y, count = _log_ratios(x)
        scale = _noise(y, cfg.scale_floor)
        need = np.full(count.shape, np.log1p(cfg.rel_threshold))
        need[count == 2] = np.log1p(cfg.pair_threshold)
        with np.errstate(invalid="ignore"):
            slow = (y >= need.reshape(1, -1)) & (y >= cfg.z_threshold * scale)
        counted = np.isfinite(y)
        for p in range(len(replicas)):
            found = _episodes(slow[p], counted[p], cfg.persist_k, cfg.persist_m)
            if not found:
                continue
            onset, last, run_end = found[-1]
            last_counted = int(np.flatnonzero(counted[p])[-1])
            # Out of rotation: no request at all in minutes its peers served, since its last.
            after = slice(last_counted + 1, None)
            idle = np.asarray(counts, dtype=np.float64)[p, after] == 0
            gone = int((idle & (count[after] >= 1)).sum()) >= cfg.gone_after
            active = (
                run_end == last_counted and last_counted >= mins.size - cfg.persist_m and not gone
            )
            ep = slice(onset, last + 1)
            ok = counted[p, ep]
            # Reported against the median of the *other* replicas (the detection's median
            # includes this one, which biases the ratio low for small fleets).
            others = nanmedian_rows(np.delete(x, p, axis=0).T)[ep][ok]
            mine = x[p, ep][ok]
            ratio = float(np.median(mine / others))
            per_replica.setdefault(p, {})[name] = {
                "replica_s": _num(float(np.median(mine))),
                "peers_median_s": _num(float(np.median(others))),
                "ratio": _num(ratio),
                "z": _num(float(np.median(y[p, ep][ok])) / scale),
                "noise": _num(scale),
                "since_minute": int(mins[onset]),
                "last_minute": int(mins[last]),
                "minutes_slow": int(slow[p, ep].sum()),
                "replicas_compared": int(np.median(count[ep][ok])),
                "active": active,
                "_onset": onset,
                "_last": last,
            }
    return [_replica_finding(replicas[p], mins, e, cfg) for p, e in sorted(per_replica.items())]


def _replica_finding(
    replica: str, mins: npt.NDArray[np.int64], found: dict[str, Any], cfg: SlowReplicaConfig
) -> Finding:
    active = any(e["active"] for e in found.values())
    current = [e for e in found.values() if e["active"] or not active]  # dates: live metrics
    onset = min(e["_onset"] for e in current)
    last = max(e["_last"] for e in current)
    for e in found.values():
        del e["_onset"], e["_last"]
    ratio = max(e["ratio"] or 1.0 for e in found.values())
    severity: Severity = "critical" if ratio >= cfg.critical_ratio else "warning"
    parts = [
        f"{name.upper()} {e['ratio']:.2g}x its peers' median "
        f"({e['replica_s']:.3g} s vs {e['peers_median_s']:.3g} s)"
        for name, e in found.items()
    ]
    ago = int(mins[-1] - mins[onset])
    summary = f"replica {replica} is slow: {' and '.join(parts)}, since {ago} min ago"
    if not active:
        summary += f"; recovered {int(mins[-1] - mins[last])} min ago"
    evidence: dict[str, Any] = {
        "replica": replica,
        "metrics": sorted(found),
        "since_minute": int(mins[onset]),
        "last_minute": int(mins[last]),
        **found,
    }
    return Finding(
        kind="slow_replica",
        severity=severity,
        ranks=(),
        first_step=int(mins[onset]),
        score=round(ratio, 3),
        summary=summary,
        key=f"slow_replica:{replica}",
        evidence=evidence,
        active=active,
        last_step=int(mins[last]),
    )


def _group_of(replica: str) -> str:
    return replica.split("/", 1)[0] if "/" in replica else ""


def detect_queue_buildup(w: ServingWindow, config: QueueConfig | None = None) -> list[Finding]:
    """Queue build-up findings, one per model fleet (see the module docstring)."""
    cfg = config or QueueConfig()
    mins = np.asarray(w.minutes, dtype=np.int64)
    groups: dict[str, list[int]] = {}
    for p, name in enumerate(w.replicas):
        groups.setdefault(_group_of(name), []).append(p)
    out = []
    for group, rows in sorted(groups.items()):
        queue_n = np.asarray(w.queue_n, dtype=np.float64)[rows].sum(axis=0)
        ttft_n = np.asarray(w.ttft_n, dtype=np.float64)[rows].sum(axis=0)
        use_queue = (queue_n >= cfg.min_requests).sum() * 2 >= (ttft_n >= cfg.min_requests).sum()
        signal = "queue_s" if use_queue and queue_n.any() else "ttft"
        sums = np.asarray(w.queue_sum if signal == "queue_s" else w.ttft_sum, dtype=np.float64)
        n = queue_n if signal == "queue_s" else ttft_n
        wait = _means(sums[rows].sum(axis=0), n, cfg.min_requests)
        found = _queue_episode(wait, cfg)
        if found is None:
            continue
        onset, last, base, active = found
        tail = slice(max(0, mins.size - cfg.span), mins.size)
        arrivals = np.asarray(w.arrivals, dtype=np.float64)[rows].sum(axis=0)
        done = np.asarray(w.requests, dtype=np.float64)[rows].sum(axis=0)
        now = float(wait[last])
        label = group or "all"
        summary = (
            f"queue building up in {'model ' + group if group else 'the fleet'}: mean "
            f"{'queue wait' if signal == 'queue_s' else 'TTFT'} rose from {base:.3g} s to "
            f"{now:.3g} s over {int(mins[last] - mins[onset]) + 1} min"
        )
        if not active:
            summary += "; no longer rising"
        evidence = {
            "model": group,
            "signal": signal,
            "baseline_s": _num(base),
            "current_s": _num(now),
            "growth": _num(now / base) if base > 0 else None,
            "since_minute": int(mins[onset]),
            "last_minute": int(mins[last]),
            "wait_s": [_num(float(v)) for v in wait[tail]],
            "arrivals": [float(v) for v in arrivals[tail]],
            "completions": [float(v) for v in done[tail]],
            "replicas": [w.replicas[p] for p in rows],
        }
        out.append(
            Finding(
                kind="queue_buildup",
                severity="critical" if base > 0 and now >= 2 * cfg.growth * base else "warning",
                ranks=(),
                first_step=int(mins[onset]),
                score=round(now / base, 3) if base > 0 else 0.0,
                summary=summary,
                key=f"queue_buildup:{label}",
                evidence=evidence,
                active=active,
                last_step=int(mins[last]),
            )
        )
    return out


def _queue_episode(wait: FloatArray, cfg: QueueConfig) -> tuple[int, int, float, bool] | None:
    """(onset, last, baseline, active) of the latest build-up, in minute indices."""
    where = np.flatnonzero(np.isfinite(wait))
    v = wait[where]
    k = cfg.span
    if v.size < k + cfg.min_baseline:
        return None
    seg = np.lib.stride_tricks.sliding_window_view(v, k)  # seg[i] ends at v[i + k - 1]
    a, b = np.triu_indices(k, 1)
    slope = np.median((seg[:, b] - seg[:, a]) / (b - a), axis=1)  # Theil-Sen, per minute
    rise = slope * (k - 1)
    level = np.median(seg, axis=1) + rise / 2  # the fitted wait at the span's last minute
    need = np.maximum(cfg.rise_s, cfg.rise_rel * (level - rise))
    # The baseline: the counted minutes before the span (fewer at the start).
    base = np.full(seg.shape[0], np.nan)
    for i in range(cfg.min_baseline, min(cfg.baseline, seg.shape[0])):
        base[i] = np.percentile(v[:i], 25)
    if seg.shape[0] > cfg.baseline:
        full = np.lib.stride_tricks.sliding_window_view(v[: seg.shape[0] - 1], cfg.baseline)
        base[cfg.baseline :] = np.percentile(full, 25, axis=1)
    with np.errstate(invalid="ignore"):
        enter = (rise >= need) & (level >= cfg.growth * base)
        enter &= level - base >= cfg.min_increase_s
    stay = rise >= need / 2

    firing, quiet, onset, last, b0 = False, 0, 0, 0, 0.0
    latest: tuple[int, int, float] | None = None
    for i in range(seg.shape[0]):
        if not firing and enter[i]:
            firing, quiet, onset, last, b0 = True, 0, i, i + k - 1, float(base[i])
        elif firing and stay[i]:
            quiet, last = 0, i + k - 1
        elif firing:
            quiet += 1
            firing = quiet < k  # ends after ``span`` minutes without a rise
        if firing:
            latest = (int(where[onset]), int(where[last]), b0)
    if latest is None:
        return None
    recent = int(where[-1]) >= wait.size - k
    return (*latest, bool(firing and recent))


@register("slow_replica", kinds={"slow_replica"}, needs={"serving"})
def _detect_slow(window: Window) -> list[Finding]:
    w = window.serving
    assert w is not None
    return detect_slow_replicas(w.replicas, w.minutes, w.ttft_sum, w.ttft_n, w.tpot_sum, w.tpot_n)


@register("queue_buildup", kinds={"queue_buildup"}, needs={"serving"})
def _detect_queue(window: Window) -> list[Finding]:
    assert window.serving is not None
    return detect_queue_buildup(window.serving)

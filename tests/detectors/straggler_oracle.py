"""The per-rank straggler episode path as it stood before the episode bookkeeping was
vectorized (``detectors/straggler_episodes.py``): one Python pass per rank that fired. Kept
as the oracle of ``test_straggler_episodes.py``, which checks on random windows that the
vectorized path gives identical findings. It reads the same prepared window
(``detectors.straggler._prepare``) and changes with the rules, never with the speed-ups.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from detectors.finding import Finding, Severity
from detectors.robust import nanmedian_rows
from detectors.straggler import StragglerConfig, _Prepared
from detectors.straggler_finding import TIMES
from detectors.straggler_finding import sig as _sig
from detectors.straggler_ratio import compute_by_step
from detectors.timing import compute_time

FloatArray = npt.NDArray[np.float64]
F32Array = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def report_per_rank(prep: _Prepared, cfg: StragglerConfig) -> list[Finding]:
    """``detect_stragglers``'s findings for a prepared window, rank by rank."""
    block, pairwise = prep.block, prep.pairwise
    times, comm, reference = prep.times, prep.comm, prep.reference
    median_compute: FloatArray | None = reference if pairwise else None

    def episodes(rows: list[int], step_s: FloatArray | None, min_span_s: float) -> list[Finding]:
        nonlocal median_compute
        if not rows:
            return []
        if median_compute is None:
            median_compute = nanmedian_rows(compute_by_step(times, comm), overwrite=True)
        median = median_compute
        out = []
        for j in rows:
            col = int(block.cols[j])
            finding = _episode_finding(
                col=col,
                rank=int(prep.rank_ids[col]),
                step_ids=prep.step_ids,
                firing=block.firing[j],
                held=block.held[j],
                over=block.over[j],
                kept=block.kept[j],
                kept_held=block.kept_held[j],
                valid=block.valid[j],
                adj=block.adj[j],
                base=float(block.base[j]),
                scale=prep.scale,
                margin=prep.margin,
                median_compute=median[:, col] if pairwise else median,
                reference=reference[:, col] if pairwise else reference,
                pairwise=pairwise,
                times=times,
                comm=comm,
                cfg=cfg,
                step_s=step_s,
                min_span_s=min_span_s,
            )
            if finding is not None:
                out.append(finding)
        return out

    findings = episodes(list(range(block.cols.size)), None, 0.0)
    if len(findings) > 1 or (pairwise and findings):
        named = {f.ranks[0] for f in findings}
        rows = [j for j, c in enumerate(block.cols.tolist()) if int(prep.rank_ids[c]) in named]
        cols = block.cols[rows]
        step_s = nanmedian_rows(np.ascontiguousarray(times[cols].T))
        findings = episodes(rows, step_s, cfg.noisy_min_s)
    findings.sort(key=lambda f: (-f.score, f.ranks))
    return findings


def _runs(mask: BoolArray) -> list[tuple[int, int]]:
    """Inclusive (start, end) index pairs of the True runs of a 1-D mask."""
    padded = np.concatenate(([False], mask, [False]))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return [(int(a), int(b) - 1) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _episode_finding(
    *,
    col: int,
    rank: int,
    step_ids: IntArray,
    firing: BoolArray,
    held: BoolArray,
    over: BoolArray,
    kept: BoolArray,
    kept_held: BoolArray,
    valid: BoolArray,
    adj: FloatArray,
    base: float,
    scale: FloatArray,
    margin: FloatArray,
    median_compute: FloatArray,
    reference: FloatArray,
    pairwise: bool,
    times: FloatArray,
    comm: FloatArray | None,
    cfg: StragglerConfig,
    step_s: FloatArray | None = None,
    min_span_s: float = 0.0,
) -> Finding | None:
    """The finding for one rank that fired: its most recent episode, or None when every
    episode rests on fewer than ``persist_k`` observed slow steps (e.g. one slow step and
    then no more reports: carrying that state forward is not evidence)."""
    episodes: list[tuple[int, int, int, int]] = []  # (onset, last, detected, end) indices
    for start, end in _runs(firing):
        window = max(0, start - cfg.persist_m + 1)
        # Onset: where the run of steps at the hold level that holds the first observed
        # over-threshold step (else carried one) of the steps that met the persistence
        # rule began. Core: up to the last over-threshold step; last: the last step
        # observed at the hold level before a gap of ``persist_m - persist_k`` steps below
        # it, from the core's last step on.
        lead = over[window : start + 1]
        if not lead.any():
            lead = held[window : start + 1]
        onset = window + int(np.argmax(lead))
        while onset > 0 and kept_held[onset - 1]:
            onset -= 1
        core = over[onset : end + 1]
        if not core.any():
            core = held[onset : end + 1]
        core_last = onset + int(np.flatnonzero(core)[-1])
        gap = max(1, cfg.persist_m - cfg.persist_k)
        run_end = core_last
        while run_end < end and kept_held[run_end + 1 : run_end + 1 + gap].any():
            run_end += 1
        observed = np.flatnonzero(kept[core_last : run_end + 1])
        last = core_last + (int(observed[-1]) if observed.size else 0)
        if int(over[onset : last + 1].sum()) < cfg.persist_k:
            continue
        ended = end < firing.size - 1
        cost, own_span = _cost(col, onset, last, times, comm, reference, base)
        if cost < cfg.min_cost_s:
            continue  # immaterial (so far): the job lost next to nothing to it
        if core_last - onset + 1 < cfg.blip_steps:
            seen_ = valid[onset : core_last + 1]
            peak = _median(adj[onset : core_last + 1][seen_].astype(np.float64))
            if (peak < cfg.blip_ratio and ended) or cost < cfg.blip_share * own_span:
                continue  # a short blip, mild and over or cheap: noise (so far)
        if (
            step_s is not None
            and float(np.nansum(step_s[onset : last + 1])) < min_span_s
            and cost < cfg.noisy_min_cost_s
        ):
            continue  # a noisy host: neither sustained nor costly (yet)
        episodes.append((onset, last, start, end))
    if not episodes:
        return None
    onset, last, detected, end = episodes[-1]
    active = end == firing.size - 1

    span = slice(onset, last + 1)
    seen = valid[span]
    rank_compute = compute_time(times[col, span], None if comm is None else comm[col, span])
    corrected = adj[span][seen].astype(np.float64)
    raw = corrected * base
    z = (corrected - 1.0) / scale[span][seen]
    ratio = _median(raw)
    over_ratio = _median(raw[over[span][seen]])
    score = _median(z)
    first_step = int(step_ids[onset])
    last_step = int(step_ids[last])

    evidence: dict[str, Any] = {
        "basis": "step_time" if comm is None else "compute",
        "median_compute_s": _sig(_median(median_compute[span][seen])),
        "reference_compute_s": _sig(_median(reference[span][seen])),
        "rank_compute_s": _sig(_median(rank_compute[seen])),
        "ratio": _sig(ratio),
        "ratio_on_slow_steps": _sig(over_ratio),
        "baseline_ratio": _sig(base),
        "ratio_vs_baseline": _sig(_median(corrected)),
        "threshold_ratio": _sig(base * (1.0 + _median(margin[span]))),
        "steps_over_threshold": int(over[span].sum()),
        "steps_observed": int(seen.sum()),
        "detected_step": int(step_ids[detected]),
        "last_slow_step": last_step,
        "persistence": f"{cfg.persist_k} of {cfg.persist_m} steps",
    }
    if pairwise:
        evidence["compared_with"] = "the other rank"
    if len(episodes) > 1:
        evidence["earlier_episodes"] = [
            [int(step_ids[a]), int(step_ids[b])] for a, b, _, _ in episodes[:-1]
        ]

    than = "the other rank" if pairwise else "the fast ranks"
    slower = f"{ratio:.2f}{TIMES} slower than {than}"
    if comm is None:
        slower += " (step time)"
    usual = f"; its normal is {base:.2f}{TIMES}" if base >= 1.02 else ""
    if active:
        verb = "computes" if comm is not None else "is"
        summary = f"rank {rank} {verb} {slower} since step {first_step}{usual}"
    else:
        verb = "computed" if comm is not None else "was"
        when = f"from step {first_step} to {last_step}, then recovered"
        summary = f"rank {rank} {verb} {slower} {when}{usual}"
    severity: Severity = "critical" if over_ratio >= cfg.critical_ratio else "warning"
    return Finding(
        kind="straggler",
        severity=severity,
        ranks=(rank,),
        first_step=first_step,
        score=_sig(score),
        summary=summary,
        key=f"straggler:{rank}",
        evidence=evidence,
        active=active,
        last_step=None if active else last_step,
    )


def _cost(
    col: int,
    onset: int,
    last: int,
    times: FloatArray,
    comm: FloatArray | None,
    reference: FloatArray,
    base: float,
) -> tuple[float, float]:
    """Seconds one episode cost: the rank's compute beyond its normal (its (S,) reference ×
    its baseline ratio), summed over the episode; and the rank's own step time over it."""
    span = slice(onset, last + 1)
    own = compute_time(times[col, span], None if comm is None else comm[col, span])
    excess = np.clip(own - reference[span] * base, 0.0, None)
    return float(np.nansum(excess)), float(np.nansum(times[col, span]))


def _median(values: FloatArray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if finite.size else float("nan")

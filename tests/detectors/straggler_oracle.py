"""The per-rank straggler episode path as it stood before the episode bookkeeping was
vectorized (``detectors/straggler_episodes.py``): one Python pass per rank that fired. Kept
as the oracle of ``test_straggler_episodes.py``, which checks on random windows that the
vectorized path gives identical findings. It reads the same prepared window
(``detectors.straggler._prepare``) and changes with the rules, never with the speed-ups.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    n = block.firing.shape[1]
    per_row = {j: _episodes(prep, j, cfg) for j in range(block.cols.size)}
    per_row = {j: eps for j, eps in per_row.items() if eps}
    # A group: rows whose most recent episode is still going, with onsets within
    # ``group_steps`` of those of ``group_ranks - 1`` others still going.
    going = {j: eps[-1] for j, eps in per_row.items() if eps[-1].end == n - 1}

    def near(a: _Episode) -> list[_Episode]:
        return [b for b in going.values() if abs(a.onset - b.onset) <= cfg.group_steps]

    group = {j for j, a in going.items() if len(near(a)) >= cfg.group_ranks}

    def grouped(j: int, e: _Episode) -> bool:
        return j in group and e is per_row[j][-1]

    def cheap(j: int, e: _Episode) -> bool:  # a group's cost counts together
        cost = sum(b.cost for b in near(e)) if grouped(j, e) else e.cost
        return cost < cfg.min_cost_s

    # Cheap episodes are immaterial, short blips noise, but a group's.
    kept = {
        j: [e for e in eps if not cheap(j, e) and (not e.blip or grouped(j, e))]
        for j, eps in per_row.items()
    }
    kept = {j: eps for j, eps in kept.items() if eps}
    if len(kept) > 1 or (pairwise and kept):
        # A noisy host: an episode must last ``noisy_min_s`` or cost ``noisy_min_cost_s``,
        # unless it is a group's or one of a rank named already.
        step_s = nanmedian_rows(np.ascontiguousarray(times[block.cols[sorted(kept)]].T))
        named_col = block.named_col
        kept = {
            j: [
                e
                for e in eps
                if float(np.nansum(step_s[e.onset : e.last + 1])) >= cfg.noisy_min_s
                or e.cost >= cfg.noisy_min_cost_s
                or e.last >= named_col[j]
                or grouped(j, e)
            ]
            for j, eps in kept.items()
        }
        kept = {j: eps for j, eps in kept.items() if eps}
    if not kept:
        return []
    median = reference if pairwise else nanmedian_rows(compute_by_step(times, comm), overwrite=True)
    findings = [_finding(prep, j, eps, median, cfg) for j, eps in sorted(kept.items())]
    findings.sort(key=lambda f: (-f.score, f.ranks))
    return findings


@dataclass(frozen=True)
class _Episode:
    onset: int
    last: int
    detected: int
    end: int
    cost: float
    blip: bool


def _runs(mask: BoolArray) -> list[tuple[int, int]]:
    """Inclusive (start, end) index pairs of the True runs of a 1-D mask."""
    padded = np.concatenate(([False], mask, [False]))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return [(int(a), int(b) - 1) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _episodes(prep: _Prepared, j: int, cfg: StragglerConfig) -> list[_Episode]:
    """Row ``j``'s episodes that are evidence enough (cost and blips judged later):
    none when every episode rests on fewer than ``persist_k`` observed slow steps (e.g. one
    slow step and then no more reports: carrying that state forward is not evidence), and
    is not the one a rank named already goes on with."""
    block = prep.block
    firing, held, over = block.firing[j], block.held[j], block.over[j]
    kept, kept_held, valid, adj = block.kept[j], block.kept_held[j], block.valid[j], block.adj[j]
    col, named_col, seed = int(block.cols[j]), int(block.named_col[j]), int(block.seed[j])
    reference = prep.reference[:, col] if prep.pairwise else prep.reference
    out: list[_Episode] = []
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
        goes_on = start <= seed <= end
        if goes_on:
            onset = named_col  # named already: its episode goes on from where it is named
        core = over[onset : end + 1]
        if not core.any():
            core = held[onset : end + 1]
        core_last = onset + int(np.flatnonzero(core)[-1]) if core.any() else onset
        gap = max(1, cfg.persist_m - cfg.persist_k)
        run_end = core_last
        while run_end < end and kept_held[run_end + 1 : run_end + 1 + gap].any():
            run_end += 1
        observed = np.flatnonzero(kept[core_last : run_end + 1])
        last = core_last + (int(observed[-1]) if observed.size else 0)
        if int(over[onset : last + 1].sum()) < cfg.persist_k and not goes_on:
            continue
        cost, own_span = _cost(
            col, onset, last, prep.times, prep.comm, reference, float(block.base[j])
        )
        blip = False
        if core_last - onset + 1 < cfg.blip_steps and last < named_col:
            seen_ = valid[onset : core_last + 1]
            peak = _median(adj[onset : core_last + 1][seen_].astype(np.float64))
            ended = end < firing.size - 1
            blip = (peak < cfg.blip_ratio and ended) or cost < cfg.blip_share * own_span
        out.append(_Episode(onset, last, start, end, cost, blip))
    return out


def _finding(
    prep: _Prepared, j: int, episodes: list[_Episode], median: FloatArray, cfg: StragglerConfig
) -> Finding:
    """The finding for row ``j``: its most recent episode of ``episodes``."""
    block, pairwise, step_ids = prep.block, prep.pairwise, prep.step_ids
    col = int(block.cols[j])
    rank = int(prep.rank_ids[col])
    comm, base = prep.comm, float(block.base[j])
    valid, adj, over = block.valid[j], block.adj[j], block.over[j]
    scale, margin = prep.scale, prep.margin
    median_compute = median[:, col] if pairwise else median
    reference = prep.reference[:, col] if pairwise else prep.reference
    e = episodes[-1]
    onset, last = e.onset, e.last
    active = e.end == block.firing.shape[1] - 1

    span = slice(onset, last + 1)
    seen = valid[span]
    rank_compute = compute_time(prep.times[col, span], None if comm is None else comm[col, span])
    corrected = adj[span][seen].astype(np.float64)
    raw = corrected * base
    z = (corrected - 1.0) / scale[span][seen]
    ratio = _median(raw)
    over_ratio = _median(raw[over[span][seen]])
    if not np.isfinite(over_ratio):  # named already, no step over the threshold here
        over_ratio = ratio
    score = _median(z)
    first_step = int(step_ids[onset])
    if block.carried[j] and onset == 0:
        first_step = min(first_step, int(block.since[j]))
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
        "detected_step": int(step_ids[e.detected]),
        "last_slow_step": last_step,
        "persistence": f"{cfg.persist_k} of {cfg.persist_m} steps",
    }
    if pairwise:
        evidence["compared_with"] = "the other rank"
    if block.joined[j]:
        evidence["joined_group"] = True
    if len(episodes) > 1:
        evidence["earlier_episodes"] = [
            [int(step_ids[x.onset]), int(step_ids[x.last])] for x in episodes[:-1]
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

"""A reported straggler episode as a :class:`~detectors.finding.Finding`: its summary line,
severity and evidence (the medians :func:`detectors.straggler_episodes.evidence_stats`
computed), for :mod:`detectors.straggler`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from detectors.finding import Finding, Severity
from detectors.robust import nanmedian_rows
from detectors.straggler_episodes import Episodes, evidence_stats, latest, material, noisy_host
from detectors.straggler_group import mark_groups
from detectors.straggler_ratio import compute_by_step

if TYPE_CHECKING:
    from detectors.straggler import StragglerConfig
    from detectors.straggler import _Prepared as Prepared

TIMES = "\u00d7"  # the multiplication sign of "1.74x slower" in summaries

__all__ = ["TIMES", "finding", "report", "sig"]


def report(prep: Prepared, cfg: StragglerConfig) -> list[Finding]:
    """Steps 5–6 and the findings: each fired rank's most recent material episode."""
    block = prep.block
    found = prep.episodes if prep.episodes is not None else material(block, cfg)
    found = mark_groups(found, block.firing.shape[1], cfg)
    # 5. Cheap episodes are immaterial and short blips noise; a group's count together.
    found = found.subset(~found.cheap & (~found.blip | found.group))
    ep, earlier = latest(found)
    if ep.rows.size > 1 or (prep.pairwise and ep.rows.size):
        # 6. More than one rank had an episode in this window (a noisy host, or several slow
        # ranks), or there are only two ranks, whose ratio carries both ranks' noise: only
        # episodes that lasted ``noisy_min_s`` seconds of step time (or cost enough) count,
        # and those of a group or of ranks named already.
        step_s = nanmedian_rows(np.ascontiguousarray(block.step[ep.rows].T))
        ep, earlier = latest(noisy_host(found, block, step_s, cfg))
    if not ep.rows.size:
        return []
    if prep.pairwise:
        median = block.reference[ep.rows]  # the other rank's compute time
    else:  # the evidence's median rank, computed only when a rank is reported
        by_step = nanmedian_rows(compute_by_step(prep.times, prep.comm), overwrite=True)
        median = np.broadcast_to(by_step, (ep.rows.size, by_step.size))
    stats = evidence_stats(block, ep, scale=prep.scale, margin=prep.margin, median=median)
    values = {k: v.tolist() for k, v in stats.items()}  # Python floats: cheaper one by one
    findings = [finding(prep, ep, earlier, values, i, cfg) for i in range(ep.rows.size)]
    findings.sort(key=lambda f: (-f.score, f.ranks))
    return findings


def finding(
    prep: Prepared,
    ep: Episodes,
    earlier: dict[int, list[tuple[int, int]]],
    stats: dict[str, list[float]],
    i: int,
    cfg: StragglerConfig,
) -> Finding:
    """The finding for reported episode ``i``: its ratio, score, evidence and summary."""
    block = prep.block
    row = int(ep.rows[i])
    rank = int(prep.rank_ids[block.cols[row]])
    onset, last, detected = int(ep.onset[i]), int(ep.last[i]), int(ep.detected[i])
    active = int(ep.end[i]) == block.firing.shape[1] - 1
    base = float(block.base[row])
    ratio = stats["ratio"][i]
    over_ratio = stats["over_ratio"][i]
    if not math.isfinite(over_ratio):  # named already, no step over the threshold here
        over_ratio = ratio
    step_ids, pairwise, comm = prep.step_ids, prep.pairwise, prep.comm
    first_step = int(step_ids[onset])
    if onset == 0 and block.carried[row]:  # it goes on: named since an earlier step
        first_step = min(first_step, int(block.since[row]))
    last_step = int(step_ids[last])

    evidence: dict[str, Any] = {
        "basis": "step_time" if comm is None else "compute",
        "median_compute_s": sig(stats["median_compute"][i]),
        "reference_compute_s": sig(stats["reference"][i]),
        "rank_compute_s": sig(stats["rank_compute"][i]),
        "ratio": sig(ratio),
        "ratio_on_slow_steps": sig(over_ratio),
        "baseline_ratio": sig(base),
        "ratio_vs_baseline": sig(stats["corrected"][i]),
        "threshold_ratio": sig(base * (1.0 + stats["margin"][i])),
        "steps_over_threshold": int(stats["over"][i]),
        "steps_observed": int(stats["observed"][i]),
        "detected_step": int(step_ids[detected]),
        "last_slow_step": last_step,
        "persistence": f"{cfg.persist_k} of {cfg.persist_m} steps",
    }
    if pairwise:
        evidence["compared_with"] = "the other rank"
    if block.joined[row]:  # under the threshold, at the hold level with a group
        evidence["joined_group"] = True
    if row in earlier:
        evidence["earlier_episodes"] = [
            [int(step_ids[a]), int(step_ids[b])] for a, b in earlier[row]
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
    # Severity from the steps over the threshold: a hysteresis tail does not dilute it.
    critical = over_ratio >= cfg.critical_ratio
    severity: Severity = "critical" if critical else "warning"
    return Finding(
        kind="straggler",
        severity=severity,
        ranks=(rank,),
        first_step=first_step,
        score=sig(stats["score"][i]),
        summary=summary,
        key=f"straggler:{rank}",
        evidence=evidence,
        active=active,
        last_step=None if active else last_step,
    )


def sig(value: float) -> float:
    """Four significant digits: readable evidence whatever the unit."""
    return float(f"{value:.4g}")

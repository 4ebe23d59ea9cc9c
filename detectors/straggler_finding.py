"""A reported straggler episode as a :class:`~detectors.finding.Finding`: its summary line,
severity and evidence (the medians :func:`detectors.straggler_episodes.evidence_stats`
computed), for :mod:`detectors.straggler`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from detectors.finding import Finding, Severity
from detectors.straggler_episodes import Episodes

if TYPE_CHECKING:
    from detectors.straggler import StragglerConfig
    from detectors.straggler import _Prepared as Prepared

TIMES = "\u00d7"  # the multiplication sign of "1.74x slower" in summaries

__all__ = ["TIMES", "finding", "sig"]


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
    step_ids, pairwise, comm = prep.step_ids, prep.pairwise, prep.comm
    first_step = int(step_ids[onset])
    last_step = int(step_ids[last])

    evidence: dict[str, Any] = {
        "basis": "step_time" if comm is None else "compute",
        "median_compute_s": sig(stats["median_compute"][i]),
        "reference_compute_s": sig(stats["reference"][i]),
        "rank_compute_s": sig(stats["rank_compute"][i]),
        "ratio": sig(ratio),
        "ratio_on_slow_steps": sig(stats["over_ratio"][i]),
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
    critical = stats["over_ratio"][i] >= cfg.critical_ratio
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

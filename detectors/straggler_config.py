"""The straggler detector's thresholds (:class:`StragglerConfig`), apart from the method
(:mod:`detectors.straggler`, which states the rules they tune) so that the modules it is
split into can share them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_CONFIG", "StragglerConfig"]


@dataclass(frozen=True)
class StragglerConfig:
    """Thresholds of :func:`detect_stragglers`. Ratios are rank time / median rank time.

    rel_threshold: a step counts as slow when the rank is at least this much slower than its
        own normal ratio (0.10 = 10%).
    z_threshold: ... and at least this many robust standard deviations (of the other ranks'
        corrected ratios at that step) above it.
    scale_floor: lower bound on that standard deviation, in ratio units, so identical ranks
        do not turn noise into huge z-scores.
    persist_k, persist_m: fire while at least ``persist_k`` of the last ``persist_m`` steps
        are slow.
    baseline_steps: the first steps of the window from which each rank's normal ratio is
        estimated (when the caller gives no ``baseline``).
    learn_steps: the first steps of a window from which :func:`learn_baselines` learns the
        normal ratios a caller keeps (more steps, a more precise normal).
    max_baseline_ratio: the largest slowdown that counts as a rank's normal (heterogeneous
        hardware); above it, the excess is a straggler from the window's start.
    reference_quantile: the quantile of the ranks' compute times each rank is compared with
        (0.25: the fast quartile; 0.5 would be the median, which a slow group drags along).
    min_ranks: steps with fewer reporting ranks are ignored (no meaningful median); a job
        of exactly two ranks is compared pairwise instead (see the module's "Two ranks").
    critical_ratio: slowdown (vs the reference, median over the episode's steps over the
        threshold) from which a finding is ``critical``.
    min_cost_s: an episode is reported once it cost the job this many seconds: the rank's
        compute beyond its normal, summed over the episode (what the others waited for it).
    blip_ratio, blip_steps, blip_share: an episode shorter than ``blip_steps`` steps is
        noise (not reported) while its cost is under ``blip_share`` of its step time over
        the episode, and once it is over, when it was under ``blip_ratio`` times slower
        than normal.
    noisy_min_s, noisy_min_cost_s: when more than one rank has an episode in the window, or
        the job has two ranks, an episode is reported once it lasted ``noisy_min_s`` seconds
        (of step time) or cost ``noisy_min_cost_s`` seconds (its compute beyond its normal,
        summed: what the other ranks waited for it) — unless the rank is named already, or
        is one of a group.
    group_ranks, group_steps: a group is at least ``group_ranks`` ranks whose episodes are
        still going and began within ``group_steps`` steps of one another.
    join_z: a rank that moved to the hold level with a group joins it once its median ratio
        since the group's onset, over n steps, is ``join_z`` standard errors (from the
        ranks' per-step spread) above its normal.
    hold_share: hysteresis. A firing rank keeps firing until ``persist_k`` of its last
        ``persist_m`` steps are under ``1 + hold_share · margin`` (the window's median
        margin ``max(rel_threshold, z_threshold · scale)``): with the defaults, 5% slower
        than its normal in a quiet job. Ranks under ``1 + hold_share · rel_threshold`` are
        the "not slow" ones the reference and the scale are taken from (steps 1 and 3).
    """

    rel_threshold: float = 0.10
    z_threshold: float = 3.0
    scale_floor: float = 0.01
    persist_k: int = 5
    persist_m: int = 8
    baseline_steps: int = 20
    max_baseline_ratio: float = 1.15
    reference_quantile: float = 0.25
    min_ranks: int = 3
    critical_ratio: float = 1.5
    blip_ratio: float = 1.3
    blip_steps: int = 10
    blip_share: float = 0.10
    min_cost_s: float = 0.5
    noisy_min_s: float = 10.0
    noisy_min_cost_s: float = 3.0
    hold_share: float = 0.5
    group_ranks: int = 3
    group_steps: int = 8
    join_z: float = 5.0
    learn_steps: int = 100

    def __post_init__(self) -> None:
        if self.rel_threshold <= 0 or self.z_threshold < 0 or self.scale_floor <= 0:
            raise ValueError("rel_threshold and scale_floor must be > 0, z_threshold >= 0")
        if not 1 <= self.persist_k <= self.persist_m <= 255:
            raise ValueError("need 1 <= persist_k <= persist_m <= 255")
        if not 1 <= self.baseline_steps <= self.learn_steps or self.min_ranks < 2:
            raise ValueError("need 1 <= baseline_steps <= learn_steps and min_ranks >= 2")
        if self.max_baseline_ratio < 1 or self.critical_ratio <= 1:
            raise ValueError("need max_baseline_ratio >= 1 and critical_ratio > 1")
        if not 0.0 < self.reference_quantile <= 0.5:
            raise ValueError("need 0 < reference_quantile <= 0.5")
        if not 0.0 < self.hold_share <= 1.0:
            raise ValueError("need 0 < hold_share <= 1")
        if self.group_ranks < 2 or self.group_steps < 0 or self.join_z < 0:
            raise ValueError("need group_ranks >= 2, group_steps >= 0 and join_z >= 0")


DEFAULT_CONFIG = StragglerConfig()

"""Hysteresis: a rank whose straggler episode is firing stays firing while it stays at least
half the threshold slower than its normal, so a group sitting right at the threshold
(1.10–1.15x) is one episode per rank, not a flapping series (issue 15, item 1).

The replay slides a 200-step window every 10 steps over the job, as the backend does, with
each rank's normal ratio learned once and carried (``learn_baselines``), and keeps incidents
the way ``backend/incidents`` does: an active finding opens or updates its key's incident
(the earliest onset wins), an ended or absent one resolves it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from detectors.straggler import StragglerConfig, detect_stragglers, learn_baselines

WIDTH, EVERY = 200, 10


@dataclass
class Incidents:
    """Per rank: incidents opened (their onsets), and how many resolved while the job ran."""

    onsets: dict[int, list[int]] = field(default_factory=dict)
    resolved: dict[int, int] = field(default_factory=dict)
    open: dict[int, int] = field(default_factory=dict)  # rank -> onset of its open incident

    def flaps(self) -> int:
        """Incidents opened again for a rank already named: a notification each time."""
        return sum(len(v) - 1 for v in self.onsets.values())


def replay(times: np.ndarray) -> Incidents:
    n_ranks, n_steps = times.shape
    base = np.full(n_ranks, np.nan)
    out = Incidents()
    for end in range(50, n_steps + 1, EVERY):
        lo = max(0, end - WIDTH)
        steps, window = np.arange(lo, end), times[:, lo:end]
        active = {}
        for f in detect_stragglers(steps, window, baseline=base):
            if f.active:
                active[f.ranks[0]] = f.first_step
        for rank in set(out.open) - set(active):
            del out.open[rank]
            out.resolved[rank] = out.resolved.get(rank, 0) + 1
        for rank, first in active.items():
            if rank not in out.open:
                out.onsets.setdefault(rank, []).append(first)
                out.open[rank] = first
            out.open[rank] = min(out.open[rank], first)
            out.onsets[rank][-1] = out.open[rank]
        learned = learn_baselines(steps, window)
        todo = ~np.isfinite(base)
        base[todo] = learned[todo]
    return out


def group_job(
    seed: int, *, ranks: int = 32, steps: int = 2000, onset: int = 300, factor: float = 1.12
) -> tuple[np.ndarray, list[int]]:
    """0.5 s steps, 2% per-rank and 2% job-wide jitter; 30% of the ranks ``factor`` slower
    from ``onset`` to the end."""
    rng = np.random.default_rng(seed)
    times = 0.5 * (1.0 + 0.02 * rng.standard_normal((ranks, steps)))
    times *= 1.0 + 0.02 * rng.standard_normal(steps)
    slow = sorted(int(r) for r in rng.choice(ranks, round(0.3 * ranks), replace=False))
    times[slow, onset:] *= factor
    return times, slow


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_sustained_112x_group_is_one_episode_per_rank(seed: int) -> None:
    times, slow = group_job(seed)
    seen = replay(times)
    assert sorted(seen.onsets) == slow  # every slow rank, no other
    assert seen.flaps() == 0, {r: len(v) for r, v in seen.onsets.items() if len(v) > 1}
    assert seen.resolved == {}  # never resolved mid-way
    assert sorted(seen.open) == slow  # still named at the end, 1,700 steps on
    for rank in slow:
        [first] = seen.onsets[rank]
        assert 300 <= first <= 305, (rank, first)  # dated at the onset


def test_a_group_that_recovers_is_resolved_once() -> None:
    times, slow = group_job(3, steps=1200)
    times[slow, 900:] /= 1.12  # back to normal at step 900
    seen = replay(times)
    assert sorted(seen.onsets) == slow and seen.flaps() == 0
    assert seen.resolved == dict.fromkeys(slow, 1) and seen.open == {}


def test_a_firing_rank_holds_at_half_the_threshold_and_ends_below_it() -> None:
    """Quiet ranks (0.5% noise): 1.2x for 40 steps, 1.07x (over 1 + 0.10 / 2) for 60, then
    normal. One episode from step 40 to 139; without hysteresis it ended at step 79."""
    rng = np.random.default_rng(4)
    times = 0.5 * (1.0 + 0.005 * rng.standard_normal((16, 200)))
    times[5, 40:80] *= 1.2
    times[5, 80:140] *= 1.07
    [f] = detect_stragglers(np.arange(200), times)
    assert f.ranks == (5,) and not f.active
    assert (f.first_step, f.last_step) == (40, 139)
    assert "earlier_episodes" not in f.evidence
    # 1.07x from the start is not an episode: hysteresis only holds one that fired.
    times[5, 40:80] /= 1.2 / 1.07
    assert detect_stragglers(np.arange(200), times) == []


def test_the_hold_share_is_configurable_and_validated() -> None:
    rng = np.random.default_rng(4)
    times = 0.5 * (1.0 + 0.005 * rng.standard_normal((16, 200)))
    times[5, 40:80] *= 1.2
    times[5, 80:140] *= 1.07
    [f] = detect_stragglers(np.arange(200), times, config=StragglerConfig(hold_share=1.0))
    assert (f.first_step, f.last_step) == (40, 79)  # no hysteresis: ends where 1.07x starts
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="hold_share"):
            StragglerConfig(hold_share=bad)


def test_a_hysteresis_tail_does_not_dilute_the_severity() -> None:
    """1.6x for 20 steps, then 1.07x for 60: one episode, critical from its slow steps."""
    rng = np.random.default_rng(5)
    times = 0.5 * (1.0 + 0.005 * rng.standard_normal((16, 200)))
    times[9, 40:60] *= 1.6
    times[9, 60:120] *= 1.07
    [f] = detect_stragglers(np.arange(200), times)
    assert (f.first_step, f.last_step) == (40, 119)
    assert f.evidence["ratio"] < 1.5  # the median over all 80 steps
    assert f.evidence["ratio_on_slow_steps"] == pytest.approx(1.6, abs=0.03)
    assert f.severity == "critical"

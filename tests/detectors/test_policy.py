"""The recovery cost model: known answers for the common incidents."""

from __future__ import annotations

import doctest
import math

import pytest

import detectors.policy
from detectors.policy import Facts, decide, facts_from_incident, human_seconds

HOURS = 3600.0


def costs(decision):  # type: ignore[no-untyped-def]
    return {c.action: c.cost_s for c in decision.candidates}


def test_doctests() -> None:
    assert doctest.testmod(detectors.policy).failed == 0


def test_3pct_straggler_with_hours_left_is_evicted_when_allowed() -> None:
    facts = Facts(
        kind="straggler",
        ranks=(6,),
        slower_frac=0.03,
        horizon_s=10 * HOURS,
        since_checkpoint_s=60,
        restart_s=120,
        world_size=512,
        allow_evict=True,
    )
    d = decide(facts)
    assert d.action == "evict_rank"
    assert d.params == {"ranks": [6]}
    c = costs(d)
    assert c[None] == pytest.approx(0.03 * 10 * HOURS)  # 18 min
    assert c["evict_rank"] == pytest.approx(120 + 60 + 10 * HOURS / 511)
    assert c["restart"] == pytest.approx(120 + 60 + 0.5 * 0.03 * 10 * HOURS)
    assert "18 min" in d.explanation and "4.2 min" in d.explanation
    reasoning = d.to_dict()
    assert [r["action"] for r in reasoning["candidates"]] == ["evict_rank", "restart", None]
    assert "estimate" in reasoning["estimate"]


def test_eviction_needs_allow_evict() -> None:
    facts = Facts(
        kind="straggler", ranks=(6,), slower_frac=0.03, horizon_s=10 * HOURS,
        since_checkpoint_s=60, world_size=512,
    )  # fmt: skip
    d = decide(facts)
    assert d.action == "restart"  # 12 min beats 18 min by more than min_gain_s
    assert ("evict_rank", "eviction is off for this job (params.allow_evict)") in d.skipped


def test_small_gain_does_not_justify_a_restart() -> None:
    d = decide(Facts(kind="straggler", ranks=(6,), slower_frac=0.03, horizon_s=4 * HOURS))
    assert d.action is None
    assert "min_gain_s" in d.explanation


def test_transient_straggler_gets_nothing() -> None:
    facts = Facts(
        kind="straggler", ranks=(6,), active=False, slower_frac=0.5, horizon_s=10 * HOURS,
        world_size=512, allow_evict=True,
    )  # fmt: skip
    d = decide(facts)
    assert d.action is None
    assert costs(d)[None] == 0
    assert "already cleared" in d.explanation


def costs_text(d):  # type: ignore[no-untyped-def]
    return {c.action: c.explanation for c in d.candidates}


def test_hang_is_restarted() -> None:
    d = decide(Facts(kind="hang", ranks=(3,), since_checkpoint_s=600, world_size=8))
    assert (d.action, d.target_ranks) == ("restart", None)
    c = costs(d)
    assert c["restart"] == pytest.approx(720)
    assert c[None] == pytest.approx(1800 + 120 + 600)  # a person restarts it later
    assert c["dump_stacks"] == c[None]  # stacks alone leave it hung


def test_a_hang_near_the_end_of_the_run_is_still_restarted() -> None:
    """A hung job never finishes on its own: how little is left does not make waiting
    cheaper (it made 'nothing' win with 11 s left of a 400-step demo job)."""
    d = decide(Facts(kind="hang", ranks=(1,), horizon_s=11, restart_s=120, min_gain_s=300))
    assert d.action == "restart"
    assert "never finishes on its own" in costs_text(d)[None]


def test_crash_is_restarted_unless_it_already_recovered() -> None:
    assert decide(Facts(kind="crash", ranks=(1,))).action == "restart"
    assert decide(Facts(kind="crash", ranks=(1,), active=False)).action is None


def test_a_nan_near_the_end_of_the_run_is_still_rolled_back() -> None:
    """A diverged model is no result however little of the run is left."""
    d = decide(Facts(kind="nan", horizon_s=11, restart_s=120, min_gain_s=300, first_step=75))
    assert d.action == "rollback"
    assert "a person rolls it back later anyway" in costs_text(d)[None]


def test_nan_is_rolled_back_to_before_the_first_bad_step() -> None:
    d = decide(Facts(kind="nan", first_step=1200, since_checkpoint_s=300))
    assert d.action == "rollback"
    assert d.params == {"before_step": 1199}  # the update before the first bad loss is suspect


def test_slowdown_gets_stacks_not_a_restart() -> None:
    d = decide(Facts(kind="slowdown", slower_frac=0.3, horizon_s=10 * HOURS))
    assert d.action == "dump_stacks"
    assert "restart" not in costs(d)
    # A restart is considered only when the policy lists it.
    allowed = decide(
        Facts(kind="slowdown", slower_frac=0.3, horizon_s=10 * HOURS, allowed=("restart",))
    )
    assert allowed.action == "restart"
    assert ("dump_stacks", "not allowed by the policy") in allowed.skipped


def test_memory_pressure_checkpoints_when_work_is_at_risk() -> None:
    at_risk = decide(Facts(kind="memory_pressure", failure_p=0.5, since_checkpoint_s=1800))
    assert at_risk.action == "checkpoint_now"
    just_saved = decide(Facts(kind="memory_pressure", failure_p=0.5, since_checkpoint_s=10))
    assert just_saved.action is None


def test_disallowed_actions_are_skipped() -> None:
    d = decide(Facts(kind="hang", ranks=(3,), allowed=("dump_stacks",)))
    assert d.action == "dump_stacks"
    assert ("restart", "not allowed by the policy") in d.skipped
    assert decide(Facts(kind="nan", allowed=())).action is None
    d = decide(Facts(kind="straggler", ranks=(1,), slower_frac=0.5, allowed=("checkpoint_now",)))
    assert d.action is None
    assert d.skipped[-1][0] == "checkpoint_now"


def test_cannot_evict_every_rank() -> None:
    facts = Facts(kind="straggler", ranks=(0, 1), slower_frac=0.5, world_size=2, allow_evict=True)
    d = decide(facts)
    assert "evict_rank" not in costs(d)
    assert any(a == "evict_rank" for a, _ in d.skipped)


def test_facts_from_incident_reads_evidence_and_params() -> None:
    evidence = {"rank_compute_s": 1.3, "median_compute_s": 1.0, "ratio": 1.3}
    facts = facts_from_incident(
        kind="straggler", ranks=(6,), active=True, evidence=evidence,
        params={"horizon_s": 7200, "allow_evict": True, "restart_s": 60}, step_s=1.5,
        since_checkpoint_s=-5, world_size=16,
    )  # fmt: skip
    assert facts.slower_frac == pytest.approx(0.3 / 1.2)  # 0.3 s extra on a 1.2 s step
    assert (facts.horizon_s, facts.restart_s, facts.allow_evict) == (7200, 60, True)
    assert facts.since_checkpoint_s == 0
    no_compute = facts_from_incident(
        kind="straggler", ranks=(6,), active=True, evidence={"ratio": 1.1}, params={},
        step_s=None, since_checkpoint_s=0, world_size=16,
    )  # fmt: skip
    assert no_compute.slower_frac == pytest.approx(0.1)
    memory = facts_from_incident(
        kind="memory_pressure", ranks=(0,), active=True, evidence={"steps_to_capacity": 100},
        params={}, step_s=1.0, since_checkpoint_s=0, world_size=1,
    )  # fmt: skip
    assert memory.failure_p == 0.9


def test_human_seconds() -> None:
    assert [human_seconds(s) for s in (45, 250, 1080, 36_000)] == [
        "45 s",
        "4.2 min",
        "18 min",
        "10 h",
    ]
    assert human_seconds(math.inf) == "unbounded"


def test_apply_swap_policy_is_a_default_candidate_the_swap_loop_sends() -> None:
    for kind in ("opseq_change", "memory_pressure"):
        d = decide(Facts(kind=kind, failure_p=0.5, since_checkpoint_s=1800))
        assert ("apply_swap_policy", detectors.policy.SWAP_LOOP_NOTE) in d.skipped
        assert d.action != "apply_swap_policy"
    assert "apply_swap_policy" not in detectors.policy.DISRUPTIVE
    refused = decide(Facts(kind="opseq_change", allowed=("dump_stacks",)))
    assert ("apply_swap_policy", "not allowed by the policy") in refused.skipped

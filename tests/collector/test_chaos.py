"""VIGIL_CHAOS parsing and the faults that act inside the process."""

from __future__ import annotations

import time

import pytest

from collector.chaos import Chaos, ChaosSpecError, parse_spec

SPEC = (
    "straggler:rank=2,from_step=50,delay_s=0.2;hang:rank=1,at_step=120;"
    "crash:rank=3,at_step=200;nan:at_step=300;slow_collective:rank=0,factor=4"
)


def test_spec_from_the_issue_parses():
    kinds = [f.kind for f in parse_spec(SPEC)]
    assert kinds == ["straggler", "hang", "crash", "nan", "slow_collective"]


def test_faults_apply_to_their_rank_and_attempt():
    assert [f.kind for f in Chaos.parse(SPEC, rank=2, attempt=0).faults] == ["straggler", "nan"]
    assert [f.kind for f in Chaos.parse(SPEC, rank=0, attempt=0).faults] == [
        "nan",
        "slow_collective",
    ]
    assert Chaos.parse(SPEC, rank=2, attempt=1).faults == []  # restarts recover
    assert Chaos.parse("crash:at_step=3,attempt=*", rank=0, attempt=4).faults


@pytest.mark.parametrize("bad", ["explode:rank=1", "hang:rank", "straggler:delay_s=x"])
def test_bad_spec_is_ignored_not_fatal(bad):
    if "delay_s=x" in bad:
        chaos = Chaos.parse(bad, rank=0, attempt=0)
        with pytest.raises(ChaosSpecError):
            chaos.at_step_end(0)
        return
    assert not Chaos.parse(bad, rank=0, attempt=0)


def test_straggler_really_sleeps_from_its_step():
    chaos = Chaos.parse("straggler:from_step=5,delay_s=0.05", rank=0, attempt=0)
    started = time.perf_counter()
    chaos.at_step_end(4)
    assert time.perf_counter() - started < 0.05
    chaos.at_step_end(5)
    assert time.perf_counter() - started >= 0.05


def test_nan_poisons_only_its_step():
    chaos = Chaos.parse("nan:at_step=7", rank=0, attempt=0)
    assert [chaos.poison_gradients(s) for s in (6, 7, 8, None)] == [False, True, False, False]

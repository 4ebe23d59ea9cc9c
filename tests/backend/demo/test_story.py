"""The demo job says how long it is, so its recovery estimates are not over an assumed
horizon (issue 17: the straggler's estimate on a 96-second demo job said "30 h rather than
2.5 days"; then "assumed 10 h left"). The full chain, ``run_plan`` event to the cost
model's horizon, is ``tests/backend/recovery/test_horizon.py``; the demo run itself is the
slow test in ``tests/backend/test_cli.py``."""

from __future__ import annotations

import pytest

from backend.demo.story import FAST, FULL, POLICIES, Scenario, job_env
from collector.config import Config


@pytest.mark.parametrize("scenario", [FAST, FULL], ids=["fast", "full"])
def test_the_demo_job_sends_its_planned_length(scenario: Scenario) -> None:
    assert Config.resolve(environ=job_env(scenario)).total_steps == scenario.steps


def test_no_policy_assumes_a_horizon() -> None:
    assert not any("horizon_s" in p.get("params", {}) for p in POLICIES.values())

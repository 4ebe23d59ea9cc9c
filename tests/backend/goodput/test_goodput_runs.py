"""Goodput of a job launched more than once (issue 17): the time between one run's last
step and the next run's first is downtime, said as ``between_runs``, not a restart inside
a run; restarts count per run; ``?run=N`` accounts one run alone."""

from __future__ import annotations

from typing import Any

import pytest

from tests.backend.goodput.test_goodput_api import JOB, T0, goodput, heartbeat, send, steps
from tests.conftest import ADMIN


@pytest.fixture
def relaunched(client) -> None:  # type: ignore[no-untyped-def]
    """Run 1 (key ``launch-a``): steps 0..29, one a second, then a clean exit. Run 2
    (``launch-b``) starts 50 s after run 1's last step, resumes at step 30 and runs steps
    30..39; its ranks restart once (15 s down) and go on with steps 40..49."""
    a = [(n, T0 + n + 1) for n in range(30)]
    send(client, steps(a, duration=1.0, data=0.0), run="launch-a")
    send(client, [{**heartbeat(T0 + 30), "exiting": True, "exit_code": 0}], run="launch-a")
    b0 = [(n, T0 + 80 + (n - 29)) for n in range(30, 40)]
    send(client, steps(b0, duration=1.0, data=0.0), run="launch-b")
    b1 = [(n, T0 + 105 + (n - 39)) for n in range(40, 50)]
    send(
        client, [*steps(b1, duration=1.0, data=0.0), heartbeat(T0 + 115)], run="launch-b", attempt=1
    )


def test_the_gap_between_runs_is_downtime_between_runs(client, relaunched) -> None:  # type: ignore[no-untyped-def]
    g = goodput(client)
    assert g["total_s"] == pytest.approx(115)
    assert g["productive_s"] == pytest.approx(50)
    assert g["badput"]["between_runs"] == pytest.approx(50)  # run 1's end to run 2's start
    assert g["badput"]["disruption_recovery"] == pytest.approx(15)  # run 2's own restart
    assert g["restarts"] == 1  # a new run is no restart
    assert g["steps_lost"] == 0
    assert sum(g["badput"].values()) + g["productive_s"] == pytest.approx(g["total_s"])


def test_one_run_alone(client, relaunched) -> None:  # type: ignore[no-untyped-def]
    first: dict[str, Any] = client.get(f"/api/v1/jobs/{JOB}/goodput?run=1", headers=ADMIN).json()
    assert first["run"] == 1
    assert (first["total_s"], first["productive_s"]) == (pytest.approx(30), pytest.approx(30))
    assert first["badput"]["between_runs"] == 0
    second = client.get(f"/api/v1/jobs/{JOB}/goodput?run=2", headers=ADMIN).json()
    assert second["run"] == 2
    assert second["total_s"] == pytest.approx(35)  # from its first step to its last heartbeat
    assert second["badput"]["disruption_recovery"] == pytest.approx(15)
    assert second["restarts"] == 1
    missing = client.get(f"/api/v1/jobs/{JOB}/goodput?run=3", headers=ADMIN)
    assert missing.status_code == 404 and "run 3" in missing.json()["detail"]

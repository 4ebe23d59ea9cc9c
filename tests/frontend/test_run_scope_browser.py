"""The job page of a job launched twice, in a real browser (Chromium, as ``test_browser``):
it shows the run it draws, not both mixed (issue 17, "jobs have no life cycle"). Run 1
(1.0 s steps) had a straggler; run 2 (0.2 s steps) is current and clean
(``test_run_scope``'s job). The page for run 2 shows run 2's goodput, no incident, and
its live steps; "all runs" lists run 1's straggler with its run. Screenshots are kept
(``VIGIL_RUN_SCOPE_SHOTS``: a file prefix, else the test's folder).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.db import make_engine
from backend.incidents.service import apply_findings
from backend.jobs.models import Job
from detectors.finding import Finding
from tests.conftest import ADMIN
from tests.frontend.test_browser import browser, charts_drawn, page  # noqa: F401  (fixtures)
from tests.frontend.test_run_scope import JOB, RANKS, STEPS, goodbye, launch, send
from tests.frontend.test_runs_browser import wait_for
from tests.servers import live_server

pytestmark = pytest.mark.slow
CHARTS = ("#step-time-chart", "#goodput-chart")
STRAGGLER = Finding(
    kind="straggler",
    severity="warning",
    ranks=(2,),
    first_step=50,
    score=1.4,
    summary="rank 2 computes 1.40× slower than the fast ranks since step 50",
    key="straggler:2",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Detection off (its clock would read the old steps as a crash, or not in time on a
    busy host): run 1's straggler is written as detection would, while run 1 is current."""
    url = f"sqlite:///{tmp_path_factory.mktemp('run-scope-ui') / 'vigil.db'}"
    env = {"VIGIL_DETECT_INTERVAL_S": "0", "VIGIL_SWEEP_INTERVAL_S": "3600"}
    t0 = time.time() - 250  # run 2 ends a few seconds ago: live steps follow on
    with live_server(url, **env) as base, httpx.Client(base_url=base, timeout=30) as client:
        launch(client, 1, t0=t0, slow_rank=2)
        engine = make_engine(url)
        with Session(engine) as session:
            job_id = session.scalar(select(Job.id).where(Job.name == JOB))
            assert job_id is not None
            apply_findings(session=session, job_id=job_id, findings=[STRAGGLER], covered_kinds=[])
            session.commit()
        engine.dispose()
        goodbye(client, 1, t0 + 121)
        launch(client, 2, t0=t0 + 235)
        yield base


def shot(tab: Any, tmp_path: Path, name: str) -> None:
    prefix = os.environ.get("VIGIL_RUN_SCOPE_SHOTS")
    path = Path(f"{prefix}{name}.png") if prefix else tmp_path / f"{name}.png"
    tab.screenshot(path=str(path), full_page=True)


def shown_incidents(tab: Any) -> list[str]:
    return list(
        tab.eval_on_selector_all("#incidents tbody tr[data-id]", "rs => rs.map(r => r.dataset.id)")
    )


def test_the_page_of_the_current_run_shows_that_run(
    server: str,
    page: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    page.goto(f"{server}/jobs/{JOB}")
    charts_drawn(page, CHARTS)
    assert page.locator("#run-select").input_value() == "2"
    assert page.inner_text("#step-time") == "0.200 s"
    # Run 2 alone: every second of it was a productive step (the job's goodput, with
    # run 1's 120 steps redone and the downtime between runs, is a few percent).
    assert page.inner_text("#goodput-value") == "100.0%"
    assert shown_incidents(page) == [] and page.inner_text("#open-incidents") == "0"
    assert page.inner_text("#incidents-scope") == "all runs"
    # Live: run 2 goes on; its new steps (0.2 s) extend its trace.
    with httpx.Client(base_url=server, timeout=30) as client:
        params = {"run": 2, "rank": 0, "from_step": STEPS[2] - 1}
        steps = client.get(f"/api/v1/jobs/{JOB}/steps", params=params, headers=ADMIN).json()
        end = steps["items"][0]["ts"]  # run 2 goes on where it was, at 0.2 s a step
        more = [
            {"type": "step", "step": n, "ts": end + 0.2 * k, "duration_s": 0.2, "comm_s": 0.08}
            for k, n in enumerate(range(STEPS[2], STEPS[2] + 10), start=1)
        ]
        for rank in range(RANKS):
            send(client, more, rank=rank, run="launch-2")
    last = str(STEPS[2] + 9)
    wait_for(lambda: page.inner_text("#current-step") == last, "live step")
    y = page.evaluate("Array.from(document.querySelector('#step-time-chart').data[0].y)")
    assert set(y) == {0.2}, y
    shot(page, tmp_path, "run2")
    assert page.errors == []


def test_all_runs_lists_the_earlier_runs_incident_with_its_run(
    server: str,
    page: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    page.goto(f"{server}/jobs/{JOB}")
    page.click("#incidents-scope")
    page.wait_for_url(f"**/jobs/{JOB}?run=2&incidents=all")
    charts_drawn(page, CHARTS)
    ids = shown_incidents(page)
    assert len(ids) == 1, page.inner_text("#incidents tbody")
    [incident] = ids
    row = page.inner_text(f'#incidents tr[data-id="{incident}"]')
    assert "#1" in row and "straggler" in row, row
    assert page.locator("#incidents-scope").inner_text() == "run #2 only"
    shot(page, tmp_path, "all-runs")
    page.goto(f"{server}/jobs/{JOB}?run=1")
    charts_drawn(page, CHARTS)
    assert shown_incidents(page) == [incident]
    assert page.inner_text("#step-time") == "1.000 s"
    page.locator("#live-status").filter(has_text="run #2 is current").wait_for()
    shot(page, tmp_path, "run1")
    assert page.errors == []

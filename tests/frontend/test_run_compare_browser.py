"""Comparing two runs of a job in a real browser (Chromium, as ``test_browser``): the job
page draws the latest run by default, and picking a second run in "overlay" draws both on
the step-time and loss charts, one trace per run named "run N" (issue 17, "evidence people
can read": a job name launched again is a new run, and nothing showed two runs side by
side). A screenshot of the overlay is kept (``VIGIL_OVERLAY_SHOT``, else the test's folder).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import INGEST
from tests.factories import batch
from tests.frontend.test_browser import browser, charts_drawn, page  # noqa: F401  (fixtures)
from tests.servers import live_server

pytestmark = pytest.mark.slow
JOB = "tiny-gpt"
# Run 1: 160 steps at ~0.27 s. Run 2: 120 steps at ~0.30 s, slower from step 60 (~0.42 s),
# its loss starting lower. (steps, step time, first loss)
RUNS = {1: (160, 0.27, 4.0), 2: (120, 0.30, 3.2)}


def step_time(run: int, n: int) -> float:
    base = RUNS[run][1] + 0.01 * math.sin(n / 5)
    return base + (0.12 if run == 2 and n >= 60 else 0.0)


def launch(client: httpx.Client, run: int, ranks: int = 2) -> None:
    """One launch of the job (its own run key), then a clean goodbye from every rank."""
    steps, _, loss0 = RUNS[run]
    now, key = time.time(), f"launch-{run}"
    for rank in range(ranks):
        events: list[dict[str, Any]] = [
            {
                "type": "step",
                "step": n,
                "ts": now - steps + n,
                "duration_s": step_time(run, n),
                "comm_s": 0.05,
                "loss": 2.0 + (loss0 - 2.0) * math.exp(-n / 40),
            }
            for n in range(steps)
        ]
        events.append({"type": "heartbeat", "ts": now, "step": steps})
        body = batch(events, job=JOB, rank=rank, world_size=ranks, run=key)
        client.post("/api/v1/ingest", json=body, headers=INGEST).raise_for_status()
    for rank in range(ranks):
        bye = {"type": "heartbeat", "ts": now + 1, "exiting": True, "exit_code": 0}
        body = batch([bye], job=JOB, rank=rank, world_size=ranks, run=key)
        client.post("/api/v1/ingest", json=body, headers=INGEST).raise_for_status()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('compare-ui') / 'vigil.db'}"
    env = {"VIGIL_DETECT_INTERVAL_S": "0", "VIGIL_SWEEP_INTERVAL_S": "3600"}
    with live_server(url, **env) as base, httpx.Client(base_url=base, timeout=30) as client:
        launch(client, 1)
        launch(client, 2)
        yield base


def traces(tab: Any, chart: str) -> list[dict[str, Any]]:
    return list(
        tab.evaluate(
            f"Array.from(document.querySelector('{chart}').data, "
            "(t) => ({name: t.name, x: Array.from(t.x), y: Array.from(t.y)}))"
        )
    )


def test_overlaying_a_second_run_draws_one_trace_per_run(
    server: str,
    page: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    page.goto(f"{server}/jobs/{JOB}")
    charts_drawn(page, ("#step-time-chart", "#loss-chart"))
    assert page.locator("#run-select").input_value() == "2"  # the latest run by default
    [mean, _] = traces(page, "#step-time-chart")
    assert mean["name"].startswith("run 2: step time") and mean["x"] == list(range(120))

    page.select_option("#compare-select", "1")  # the form loads the page for the choice
    page.wait_for_url("**/jobs/tiny-gpt?run=2&compare=1")
    charts_drawn(page, ("#step-time-chart", "#loss-chart"))
    for chart in ("#step-time-chart", "#loss-chart"):
        drawn = traces(page, chart)
        assert [t["name"] for t in drawn] == ["run 2", "run 1"], chart
        assert [len(t["x"]) for t in drawn] == [120, 160], chart
        # Both lines are on the page, not only in the data.
        assert page.locator(f"{chart} .scatterlayer .trace path.js-line").count() == 2
        assert page.locator(f"{chart} .legend .traces").count() == 2
    run2, run1 = traces(page, "#step-time-chart")
    assert run2["y"][100] == pytest.approx(step_time(2, 100), abs=1e-6)
    assert run1["y"][100] == pytest.approx(step_time(1, 100), abs=1e-6)
    assert page.locator('#compare-select option[value="2"]').is_disabled()
    shot = Path(os.environ.get("VIGIL_OVERLAY_SHOT") or tmp_path / "overlay.png")
    page.screenshot(path=str(shot), full_page=True)
    assert page.errors == []

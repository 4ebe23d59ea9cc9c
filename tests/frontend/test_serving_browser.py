"""The serving page in a real browser (Debian's Chromium, Playwright) against a real
``vigil server``: three replicas of which one is 3× slower, an SLO it makes miss; every
chart draws, the slow replica's bar is the tallest, the headline says the SLO is violated,
and hostile names never run. A screenshot lands in the test's output folder, and in
``docs/serving-page.png`` with ``VIGIL_UPDATE_DOCS_SHOTS=1``.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.backend.telemetry.test_serving_queries import ingest_requests, synthetic_requests
from tests.conftest import ADMIN
from tests.frontend.test_browser import SERVER_ENV, browser, charts_drawn, page  # noqa: F401
from tests.servers import live_server

JOB = "chat-prod"
XSS_JOB = "<svg onload=alert(1)>"
XSS_NAME = '<img src=x onerror="alert(1)">'
CHARTS = (
    "#ttft-chart",
    "#tpot-chart",
    "#e2e-chart",
    "#traffic-chart",
    "#attainment-chart",
    "#goodput-chart",
    "#budget-chart",
    "#burn-chart",
    "#replica-bars",
    "#replica-ttft-chart",
)
DOCS_SHOT = Path(__file__).resolve().parents[2] / "docs" / "serving-page.png"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server with the last 20 minutes of a 3-replica job (``r2`` 3× slower) and its
    SLO, and a job whose SLO and replica have hostile names."""
    url = f"sqlite:///{tmp_path_factory.mktemp('serving') / 'vigil.db'}"
    t0 = (time.time() // 60 - 20) * 60
    with live_server(url, **SERVER_ENV) as base, httpx.Client(base_url=base) as client:
        for job, name in ((JOB, "interactive"), (XSS_JOB, XSS_NAME)):
            slo = {"job": job, "name": name, "ttft_s": 0.5, "tpot_s": 0.05, "objective": 0.95}
            client.post("/api/v1/slos", json=slo, headers=ADMIN).raise_for_status()
        events = synthetic_requests(t0=t0, minutes=20, per_minute=90, slow={"r2": 3.0})
        ingest_requests(client, events, job=JOB)
        hostile = synthetic_requests(t0=t0, minutes=5, per_minute=12, replicas=1, model=XSS_NAME)
        ingest_requests(client, hostile, job=XSS_JOB)
        yield base


def test_serving_page_draws_every_chart_and_the_slow_replica_stands_out(
    server: str,
    page: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    page.goto(f"{server}/jobs/{JOB}/serving")
    traces = charts_drawn(page, CHARTS)
    assert all(n >= 1 for n in traces.values()), traces
    bars = page.evaluate("document.querySelector('#replica-bars').data[0]")
    assert bars["name"].startswith("mean TTFT")
    tallest = bars["x"][bars["y"].index(max(bars["y"]))]
    assert tallest == "llama/r2", bars
    tpot = page.evaluate("document.querySelector('#replica-bars').data[1]")
    assert tpot["x"][tpot["y"].index(max(tpot["y"]))] == "llama/r2"
    # r2 misses the SLO most of the time: the headline says it is violated now.
    headline = page.inner_text("#slo-headline")
    assert "SLO violated now: interactive" in headline, headline
    assert "level-critical" in (page.get_attribute("#slo-headline", "class") or "")
    assert page.locator('#replicas-table tr.slowest[data-replica="llama/r2"]').count() == 1
    # Thresholds drawn: the SLO's TTFT line, and the burn-rate alert lines 14.4×, 6×, 1×.
    shapes = page.evaluate("document.querySelector('#ttft-chart').layout.shapes.map(s => s.y0)")
    assert 0.5 in shapes
    burn = page.evaluate("document.querySelector('#burn-chart').layout.shapes.map(s => s.y0)")
    assert sorted(burn) == [1.0, 6.0, 14.4]
    page.wait_for_selector("#live-status:has-text('updated')", timeout=20_000)
    page.screenshot(path=str(tmp_path / "serving.png"), full_page=True)
    if os.environ.get("VIGIL_UPDATE_DOCS_SHOTS"):  # never dirty the checkout by default
        shutil.copyfile(tmp_path / "serving.png", DOCS_SHOT)
    assert page.errors == [] and page.dialogs == []


def test_jobs_list_links_the_serving_page_with_slo_health(
    server: str,
    page: Any,  # noqa: F811
) -> None:
    page.goto(f"{server}/")
    row = page.locator(f'tr.job[data-name="{JOB}"]')
    row.wait_for()
    assert "SLO violated" in row.locator(".slo-health").inner_text()
    row.locator("a.serving-link").click()
    page.wait_for_selector("#slo-headline")
    assert page.url.endswith(f"/jobs/{JOB}/serving")
    assert page.errors == []


def test_hostile_names_never_run_as_script(
    server: str,
    page: Any,  # noqa: F811
) -> None:
    page.goto(f"{server}/jobs/{httpx.URL(path=XSS_JOB).raw_path.decode()}/serving")
    charts_drawn(page, CHARTS)
    assert XSS_NAME in page.inner_text("#slos-table")  # shown as text
    assert XSS_NAME + "/r0" in page.inner_text("#replicas-table")
    page.goto(f"{server}/")
    page.locator("tr.job").first.wait_for()
    time.sleep(0.5)
    assert page.dialogs == [], page.dialogs
    assert page.errors == []

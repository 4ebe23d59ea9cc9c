"""The dashboard in a real browser: Debian's Chromium driven by Playwright, against a real
``vigil server`` holding ingested data. Charts must draw (the plot elements have traces),
a live update must arrive over SSE, an action button must work, and user text must never
run as script. Screenshots land in each test's output folder.

Chromium comes from the system (``apt-get install chromium``; ``.ci/run`` installs it);
no browser is ever downloaded. Without it these tests are skipped, visibly.
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

from tests.conftest import ADMIN, INGEST
from tests.factories import batch
from tests.frontend.helpers import JOB, T0, ingest_job
from tests.servers import live_server

sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = os.environ.get("VIGIL_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHARTS = ("#step-time-chart", "#heatmap", "#bandwidth-chart", "#memory-chart", "#loss-chart")
XSS_JOB = "<svg onload=alert(1)>"
# Detection on (the straggler becomes an incident); the hang/crash sweep off, since the
# recorded steps are old and would read as a job that went silent.
SERVER_ENV = {"VIGIL_DETECT_INTERVAL_S": "0.3", "VIGIL_SWEEP_INTERVAL_S": "3600"}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium (or set VIGIL_CHROMIUM)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server with a 4-rank job whose rank 2 straggles from step 50, already an incident
    with a proposed action (the default policy: approve), and a job with a hostile name."""
    url = f"sqlite:///{tmp_path_factory.mktemp('ui') / 'vigil.db'}"
    with live_server(url, **SERVER_ENV) as base, httpx.Client(base_url=base) as client:
        client.put(
            f"/api/v1/jobs/{JOB}/policies/straggler",
            json={"mode": "approve", "actions": ["restart"]},
            headers=ADMIN,
        ).raise_for_status()
        ingest_job(client)  # type: ignore[arg-type]
        ingest_job(client, XSS_JOB, slow_rank=None)  # type: ignore[arg-type]
        deadline = time.monotonic() + 30
        while not _proposed(client):
            assert time.monotonic() < deadline, "no straggler incident with a proposed action"
            time.sleep(0.2)
        yield base


def _proposed(client: httpx.Client) -> bool:
    actions = client.get(f"/api/v1/jobs/{JOB}/actions", headers=ADMIN).json()
    return any(a["state"] == "proposed" for a in actions)


@pytest.fixture
def page(browser: Any, tmp_path: Path) -> Iterator[Any]:
    """A fresh page; every JavaScript error or dialog (alert!) is recorded and fails the
    test; a screenshot of the last state is saved in the test's output folder."""
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    page = context.new_page()
    page.errors, page.dialogs = [], []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.accept()))
    yield page
    page.screenshot(path=str(tmp_path / "last.png"), full_page=True)
    context.close()


def charts_drawn(page: Any, charts: tuple[str, ...] = CHARTS) -> dict[str, int]:
    """Wait until every chart says it is drawn; return its number of plotly traces."""
    traces = {}
    for chart in charts:
        page.wait_for_selector(f'{chart}[data-ready="1"]', state="attached", timeout=20_000)
        assert page.get_attribute(chart, "data-error") is None, f"{chart} failed to load"
        traces[chart] = page.evaluate(f"document.querySelector('{chart}').data.length")
    return traces


def test_jobs_page_lists_jobs(server: str, page: Any, tmp_path: Path) -> None:
    page.goto(f"{server}/")
    row = page.locator(f'tr.job[data-name="{JOB}"]')
    row.wait_for()
    assert JOB in row.inner_text()
    page.fill("#job-filter", "no-such-job")
    row.wait_for(state="hidden")
    page.screenshot(path=str(tmp_path / "jobs.png"), full_page=True)
    assert page.errors == []


def test_job_page_draws_every_chart_and_the_straggler_stands_out(
    server: str, page: Any, tmp_path: Path
) -> None:
    page.goto(f"{server}/jobs/{JOB}")
    traces = charts_drawn(page)
    assert all(n >= 1 for n in traces.values()), traces
    # The heatmap's row for rank 2 is the hottest after step 50.
    z = page.evaluate("document.querySelector('#heatmap').data[0].z")
    y = page.evaluate("document.querySelector('#heatmap').data[0].y")
    late = [sum(v for v in row[len(row) // 2 :] if v is not None) for row in z]
    hottest = y[late.index(max(late))]
    assert str(hottest) in ("2", "rank 2"), (y, late)
    page.screenshot(path=str(tmp_path / "job.png"), full_page=True)
    assert page.errors == [] and page.dialogs == []


def test_live_update_arrives_over_sse(server: str, page: Any) -> None:
    page.goto(f"{server}/jobs/{JOB}")
    charts_drawn(page, ("#step-time-chart",))
    before = page.inner_text("#current-step")
    with httpx.Client(base_url=server) as client:
        # Rank 2 stays slow: the straggler (and its proposal, approved below) stays open.
        ingest_job(client, steps=range(120, 140))  # type: ignore[arg-type]
    # Polled from here: the page's CSP forbids eval, which wait_for_function would need.
    deadline = time.monotonic() + 20
    while "139" not in page.inner_text("#current-step"):
        assert time.monotonic() < deadline, f"no live update: still {before!r}"
        time.sleep(0.2)
    assert page.errors == []


def test_incident_page_approves_the_proposed_action(server: str, page: Any, tmp_path: Path) -> None:
    # The job's ranks report now: an action can only be approved while one does.
    for rank in range(4):
        beat = batch([{"type": "heartbeat", "ts": T0 + 200}], rank=rank, world_size=4)
        httpx.post(f"{server}/api/v1/ingest", json=beat, headers=INGEST).raise_for_status()
    incidents = httpx.get(f"{server}/api/v1/jobs/{JOB}/incidents", headers=ADMIN).json()
    [incident] = [i for i in incidents if i["kind"] == "straggler"]
    page.goto(f"{server}/incidents/{incident['id']}")
    charts_drawn(page, ("#evidence-chart",))
    assert "rank 2" in page.inner_text("body").lower() or "2" in page.inner_text("#evidence-table")
    page.screenshot(path=str(tmp_path / "incident-before.png"), full_page=True)
    page.click('button[data-action="approve"]')  # confirm() is accepted by the fixture
    page.wait_for_load_state()
    deadline = time.monotonic() + 10
    while True:
        actions = httpx.get(f"{server}/api/v1/jobs/{JOB}/actions", headers=ADMIN).json()
        mine = [a for a in actions if a["incident_id"] == incident["id"]]
        if (mine and mine[0]["state"] != "proposed") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert mine[0]["state"] in ("pending", "dispatched"), mine
    assert (mine[0]["approved_by"] or "").startswith("ui:"), mine
    assert page.dialogs, "the button did not ask for confirmation"
    assert page.errors == []


def test_user_text_never_runs_as_script(server: str, page: Any) -> None:
    page.goto(f"{server}/")
    page.locator("tr.job").first.wait_for()
    assert XSS_JOB in page.inner_text("#jobs-table")  # shown as text
    page.goto(f"{server}/alerts")
    page.goto(f"{server}/settings")
    time.sleep(0.5)
    assert page.dialogs == [], page.dialogs
    assert page.errors == []


def test_a_refused_live_stream_is_retried_later(browser: Any, tmp_path: Path) -> None:
    # One live stream per process: a client of ours holds it, so the page's is refused
    # (503) — the browser would give up for good; the page says so and tries again.
    url = f"sqlite:///{tmp_path / 'vigil.db'}"
    with (
        live_server(url, **SERVER_ENV, VIGIL_MAX_STREAMS="1") as base,
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        ingest_job(client, steps=range(20), slow_rank=None)  # type: ignore[arg-type]
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        with client.stream("GET", f"/ui/jobs/{JOB}/stream?after_step=-1") as held:
            assert held.status_code == 200
            page.goto(f"{base}/jobs/{JOB}")
            status = page.locator("#live-status")
            status.filter(has_text="retrying").wait_for(timeout=20_000)
        # The held stream is closed: the next try gets the slot.
        status.filter(has_text="live").filter(has_not_text="paused").wait_for(timeout=30_000)
        page.screenshot(path=str(tmp_path / "retried.png"), full_page=True)
        page.close()
        assert errors == []

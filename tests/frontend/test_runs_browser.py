"""Runs in a real browser (Chromium, as ``test_browser``): the jobs list shows each job's
run state, and a proposal on a run with no live rank has no active Approve button — the
page says why instead (issue 17: a proposed restart kept an active Approve button after
nobody was left to run it)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN, INGEST
from tests.factories import batch
from tests.frontend.helpers import ingest_job
from tests.frontend.test_browser import browser, page  # noqa: F401  (fixtures)
from tests.servers import live_server

pytestmark = pytest.mark.slow
DEAD, DONE = "dead-run", "done-run"


def wait_for(check, what: str, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"no {what} in {timeout:.0f} s"
        time.sleep(0.2)
    return found


def goodbye(client: httpx.Client, job: str, exit_code: int) -> None:
    for rank in range(4):
        body = batch(
            [{"type": "heartbeat", "ts": time.time(), "exiting": True, "exit_code": exit_code}],
            job=job,
            rank=rank,
            world_size=4,
        )
        client.post("/api/v1/ingest", json=body, headers=INGEST).raise_for_status()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``dead-run``: a straggler with a proposed restart, then every rank exited with code
    1 (nobody left to restart: no live rank); ``done-run``: every rank exited cleanly."""
    url = f"sqlite:///{tmp_path_factory.mktemp('runs-ui') / 'vigil.db'}"
    env = {"VIGIL_DETECT_INTERVAL_S": "0.3", "VIGIL_SWEEP_INTERVAL_S": "0.5"}
    with live_server(url, **env) as base, httpx.Client(base_url=base, timeout=30) as client:
        client.put(
            f"/api/v1/jobs/{DEAD}/policies/straggler",
            json={"mode": "approve", "actions": ["restart"]},
            headers=ADMIN,
        ).raise_for_status()
        ingest_job(client, DEAD, t0=time.time() - 121)  # type: ignore[arg-type]
        wait_for(
            lambda: [
                a
                for a in client.get(f"/api/v1/jobs/{DEAD}/actions", headers=ADMIN).json()
                if a["state"] == "proposed"
            ],
            "proposed action",
        )
        goodbye(client, DEAD, exit_code=1)
        ingest_job(client, DONE, slow_rank=None, t0=time.time() - 121)  # type: ignore[arg-type]
        goodbye(client, DONE, exit_code=0)
        wait_for(
            lambda: client.get(f"/api/v1/jobs/{DONE}", headers=ADMIN).json()["state"] == "finished",
            "finished run",
        )
        yield base


def test_the_jobs_list_shows_each_runs_state(
    server: str,
    page: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    page.goto(f"{server}/")
    done = page.locator(f'tr.job[data-name="{DONE}"] .run-state')
    done.wait_for()
    assert done.inner_text() == "finished"
    assert page.locator(f'tr.job[data-name="{DEAD}"] .run-state').inner_text() == "running"
    page.screenshot(path=str(tmp_path / "jobs.png"), full_page=True)
    assert page.errors == []


def test_a_run_with_no_live_rank_offers_no_active_approve(
    server: str,
    page: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    page.goto(f"{server}/jobs/{DEAD}")
    approve = page.locator('#actions button[data-action="approve"]')
    approve.wait_for()
    assert approve.count() == 1 and approve.is_disabled()
    why = page.locator("#actions .refusal").inner_text()
    assert "has no live rank" in why, why
    assert "has no live rank" in page.locator("#run-refusal").inner_text()
    assert page.locator('#trigger-form button[data-action="trigger"]').is_disabled()
    page.screenshot(path=str(tmp_path / "dead-run.png"), full_page=True)
    assert page.errors == [] and page.dialogs == []

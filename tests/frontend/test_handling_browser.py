"""Handling an alert in a real browser (Debian's Chromium via Playwright) against a real
``vigil server``: acknowledge the straggler incident and silence it from its page; the
REST API then shows who acknowledged it and the silence that mutes it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN
from tests.frontend.helpers import JOB, ingest_job
from tests.frontend.test_browser import SERVER_ENV, browser, page  # noqa: F401 (fixtures)
from tests.servers import live_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def incident(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A server whose 4-rank job has a straggler incident: ``(base URL, incident id)``."""
    url = f"sqlite:///{tmp_path_factory.mktemp('handling') / 'vigil.db'}"
    with live_server(url, **SERVER_ENV) as base, httpx.Client(base_url=base) as client:
        ingest_job(client)  # type: ignore[arg-type]
        deadline = time.monotonic() + 30
        while True:
            found = client.get(f"/api/v1/jobs/{JOB}/incidents", headers=ADMIN).json()
            found = (
                [i for i in found if i["kind"] == "straggler"] if isinstance(found, list) else []
            )
            if found:
                break
            assert time.monotonic() < deadline, "no straggler incident"
            time.sleep(0.2)
        yield base, found[0]["id"]


def test_acknowledge_and_silence_from_the_incident_page(
    incident: tuple[str, int],
    page: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    base, incident_id = incident
    page.goto(f"{base}/incidents/{incident_id}")
    assert "open for" in page.inner_text("#handling")
    page.click("#ack-button")
    page.locator("#acked").filter(has_text="acknowledged by ui:").wait_for(timeout=10_000)
    assert page.locator("#unack-button").count() == 1

    page.select_option('#silence-form select[name="duration_s"]', "3600")
    page.fill('#silence-form input[name="rank"]', "2")
    page.fill('#silence-form input[name="comment"]', "draining the node")
    page.click("#silence-button")
    page.locator("#silenced").filter(has_text="draining the node").wait_for(timeout=10_000)
    page.screenshot(path=str(tmp_path / "handled.png"), full_page=True)

    shown = httpx.get(f"{base}/api/v1/incidents/{incident_id}", headers=ADMIN).json()
    assert shown["status"] == "open" and shown["acked_by"].startswith("ui:")
    [silence] = httpx.get(f"{base}/api/v1/silences?state=active", headers=ADMIN).json()
    assert silence["matchers"] == {"job": JOB, "kind": "straggler", "rank": 2}
    assert shown["silenced_by"] == [silence["id"]]
    page.goto(f"{base}/alerts")
    row = page.locator(f'#open-incidents tr[data-id="{incident_id}"]')
    assert "silenced" in row.inner_text() and "acknowledged" in row.inner_text()
    assert page.errors == [] and page.dialogs == []

"""The job page's run picker (issue 17, "evidence people can read"): the charts draw one
run of the job, the latest by default, and may overlay a second; the page hands its script
the REST chart routes for those runs. A run the page's address names that the job does
not have is a 404 page, a number that is no run number a 422 page. The drawing itself is
``test_run_compare_browser``'s."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.backend.telemetry.test_run_charts import JOB, launch

PAGE_DATA = re.compile(r'<script type="application/json" id="page-data">(.*?)</script>', re.S)


def page_data(html: str) -> dict[str, Any]:
    found = PAGE_DATA.search(html)
    assert found, "no page data"
    return dict(json.loads(found.group(1)))


def selected(html: str, select: str) -> list[str]:
    body = html.split(f'id="{select}"', 1)[1].split("</select>", 1)[0]
    return re.findall(r'<option value="(\d*)"[^>]*\bselected\b', body)


@pytest.fixture
def two_runs(client: Any) -> Any:
    for number in (1, 2):
        launch(client, number)
    return client


def test_the_latest_run_is_drawn_by_default(two_runs):
    html = two_runs.get(f"/jobs/{JOB}").text
    assert 'id="run-picker"' in html and selected(html, "run-select") == ["2"]
    assert selected(html, "compare-select") == [""]
    data = page_data(html)
    assert (data["run"], data["compare"], data["current_run"]) == (2, None, 2)
    for chart in ("series", "heatmap", "bandwidth"):
        assert data["urls"][chart].endswith("&run=2"), chart
    assert "compare_series" not in data["urls"]


def test_a_second_run_is_overlaid_from_the_series_route(two_runs):
    html = two_runs.get(f"/jobs/{JOB}", params={"run": 1, "compare": 2}).text
    assert selected(html, "run-select") == ["1"] and selected(html, "compare-select") == ["2"]
    data = page_data(html)
    assert (data["run"], data["compare"]) == (1, 2)
    assert data["urls"]["series"].endswith("/series?max_steps=1000&run=1")
    assert data["urls"]["compare_series"].endswith("/series?max_steps=1000&run=2")
    assert two_runs.get(data["urls"]["compare_series"]).json()["run"] == 2
    # Compared with itself, a run is compared with nothing.
    same = page_data(two_runs.get(f"/jobs/{JOB}", params={"compare": 2}).text)
    assert (same["run"], same["compare"]) == (2, None)


@pytest.mark.parametrize(
    ("params", "status", "says"),
    [
        ({"run": 9}, 404, "has no run 9"),
        ({"compare": 3}, 404, "has no run 3"),
        ({"run": "abc"}, 422, "run must be a run number"),
        ({"run": 0}, 422, "run must be a run number"),
        ({"compare": "1.5"}, 422, "compare must be a run number"),
        ({"run": "9" * 40}, 422, "run must be a run number"),
    ],
)
def test_a_run_the_job_does_not_have_is_an_error_page(two_runs, params, status, says):
    reply = two_runs.get(f"/jobs/{JOB}", params=params)
    assert reply.status_code == status and "text/html" in reply.headers["content-type"]
    assert says in reply.text


def test_a_job_with_one_run_has_no_picker(client):
    launch(client, 1)
    html = client.get(f"/jobs/{JOB}").text
    assert 'id="run-picker"' not in html
    assert page_data(html)["urls"]["series"].endswith("&run=1")

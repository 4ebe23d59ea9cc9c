"""The evidence as the pages render it (HTML, no browser): the job page warns about ranks
whose collectives are not timed, a Flight Recorder incident shows the CLI's table instead of
JSON, evidence keys read as words with units, an action's reasoning is printed once and says
what horizon it assumed, and both pages carry the stack-dump view."""

from __future__ import annotations

import html
import re
from typing import Any

from tests.frontend import evidence_data as data

TAGS = re.compile(r"<[^>]+>")


def visible(page: str) -> str:
    """The page's text as a reader sees it (tags and their attributes dropped)."""
    body = page.split("<main>", 1)[1].split("</main>", 1)[0]
    return html.unescape(" ".join(TAGS.sub(" ", body).split()))


def get(client: Any, url: str) -> str:
    reply = client.get(url)
    assert reply.status_code == 200, reply.text
    return str(reply.text)


def test_job_page_says_which_ranks_collectives_are_not_timed(client, session, settings) -> None:  # type: ignore[no-untyped-def]
    data.seed_straggler(client, session, settings)
    text = visible(get(client, f"/jobs/{data.STRAGGLER}"))
    said = "collectives not timed on ranks 1, 3: DDP's gradient all-reduces are invisible"
    assert f"{said} ({data.UNTIMED_REASON})" in text
    data.seed_nan(client, session)
    assert "collectives not timed" not in visible(get(client, f"/jobs/{data.NAN}"))


def test_flight_recorder_incident_shows_the_clis_table_not_json(client) -> None:  # type: ignore[no-untyped-def]
    page = get(client, f"/incidents/{data.seed_flight_recorder(client)}")
    text = visible(page)
    head = "PG Process Group Desc Op Seq Size Dtype Waiting Missing"
    assert head in text
    stuck = "72* EXPERT_MODEL_PARALLEL_GROUP nccl:all_to_all 45265 2048x5120 BFloat16"
    assert f"{stuck} 8,10-13,15 9,14" in text  # the group the job waits in, starred
    assert "rank 9: " in text and "rank 14: " in text  # the culprits and why
    assert '"waiting_ranks"' not in page and "[{" not in text  # no wall of JSON
    assert 'id="evidence-chart-box"' in page  # hidden by the script for chart "none"


def test_evidence_reads_as_words_with_units(client, session, settings) -> None:  # type: ignore[no-untyped-def]
    incident = data.seed_straggler(client, session, settings)
    page = get(client, f"/incidents/{incident}")
    table = page.split('id="evidence-table"', 1)[1].split("</table>", 1)[0]
    text = visible(f"<main>{table}</main>")
    assert "median compute time" in text and "slower than the reference" in text
    assert re.search(r"median compute time 0\.\d+ s", text), text
    assert not re.search(r"\b[a-z]+_[a-z_]+\b", text), text  # no snake_case left
    assert 'title="median_compute_s"' in table  # the raw key, on hover


def test_reasoning_is_printed_once_and_names_its_horizon(client, session, settings) -> None:  # type: ignore[no-untyped-def]
    incident = data.seed_straggler(client, session, settings)
    for url in (f"/incidents/{incident}", f"/jobs/{data.STRAGGLER}"):
        page = get(client, url)
        table = page.split('id="actions"', 1)[1].split("</table>\n", 2)
        actions = visible(f"<main>{table[0]}</table>{table[1]}</main>")  # it nests a table
        text = visible(page)
        reply = client.get(
            f"/api/v1/jobs/{data.STRAGGLER}/actions",
            headers={"Authorization": "Bearer vigil-dev-admin"},
        )
        [action] = [a for a in reply.json() if a["incident_id"] == incident]
        assert actions.count(" ".join(action["reason"].split())) == 1, url
        assert "left of the run: " in text and "of the 200 planned steps" in text, url


def test_both_pages_carry_the_stack_dump_view(client, session, settings) -> None:  # type: ignore[no-untyped-def]
    incident = data.seed_straggler(client, session, settings)
    job = get(client, f"/jobs/{data.STRAGGLER}")
    assert f'data-url="/api/v1/jobs/{data.STRAGGLER}/stacks"' in job
    page = get(client, f"/incidents/{incident}")
    assert f'data-url="/api/v1/incidents/{incident}/stacks"' in page
    assert '<script src="/static/stacks.js" defer>' in page

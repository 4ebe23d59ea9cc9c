"""The job page and the jobs list follow one run of a job (issue 17, "jobs have no life
cycle"): a job name launched again is a new run, and what the dashboard shows of a job
is the run being looked at (``/jobs/{job}?run=N``, default the job's current run), not
every run mixed.

Seen before: the jobs list and the job API gave the median step time of both runs'
rows together; the job page's goodput panel accounted the whole job; its live step
stream sent an earlier, longer run's steps as if they were the current run's; its
incidents table listed every run's incidents.

The job here: run 1, 120 steps at 1.0 s with rank 2 straggling from step 50 (one
incident, of run 1); then run 2, 60 steps at 0.2 s, no incident.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import numpy as np
import pytest

from backend.ui import stream as live
from tests.conftest import ADMIN, INGEST
from tests.factories import batch
from tests.frontend.helpers import detect, job_id
from tests.frontend.test_run_picker import page_data

JOB = "relaunched"
STEP_S = {1: 1.0, 2: 0.2}
STEPS = {1: 120, 2: 60}
RANKS = 4


def launch(client: Any, number: int, *, t0: float, slow_rank: int | None = None) -> None:
    """Run ``number`` of ``JOB`` (its own run key): every rank's steps, ``STEP_S[number]``
    each, step ``n`` ending at ``t0 + (n + 1) * STEP_S[number]``; ``slow_rank`` computes
    1.4× longer from step 50 (waits less in the all-reduce: a straggler)."""
    rng = np.random.default_rng(number)
    duration = STEP_S[number]
    for rank in range(RANKS):
        events: list[dict[str, Any]] = []
        for n in range(STEPS[number]):
            compute = 0.6 * duration * (1 + rng.normal(0, 0.01))
            if rank == slow_rank and n >= 50:
                compute *= 1.4
            end = t0 + (n + 1) * duration
            events.append(
                {
                    "type": "step",
                    "step": n,
                    "ts": end,
                    "duration_s": duration,
                    "comm_s": max(0.0, duration - compute),
                    "loss": 2.0,
                }
            )
            events.append(
                {
                    "type": "collective",
                    "step": n,
                    "group": "dp",
                    "op": "all_reduce",
                    "bytes": 1_000_000,
                    "duration_s": 0.01,
                    "count": 1,
                }
            )
        events.append({"type": "heartbeat", "ts": end, "step": STEPS[number]})
        send(client, events, rank=rank, run=f"launch-{number}")


def goodbye(client: Any, number: int, ts: float) -> None:
    for rank in range(RANKS):
        beat = {"type": "heartbeat", "ts": ts, "exiting": True, "exit_code": 0}
        send(client, [beat], rank=rank, run=f"launch-{number}")


def send(client: Any, events: list[dict[str, Any]], **fields: Any) -> None:
    body = batch(events, job=JOB, world_size=RANKS, **fields)
    reply = client.post("/api/v1/ingest", json=body, headers=INGEST)
    assert reply.status_code == 200, reply.text


@pytest.fixture
def relaunched(client, session, settings) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """``{"incident": run 1's straggler, "job_id"}``, run 2 being the current run."""
    t0 = time.time() - 400
    launch(client, 1, t0=t0, slow_rank=2)
    [incident] = detect(session, settings, JOB)
    assert incident.kind == "straggler" and incident.ranks == [2]
    goodbye(client, 1, t0 + 121)
    launch(client, 2, t0=t0 + 200)
    runs = client.get(f"/api/v1/jobs/{JOB}/runs", headers=ADMIN).json()
    assert [r["number"] for r in runs] == [2, 1]
    return {"incident": incident, "job_id": job_id(session, JOB)}


def get(client: Any, url: str, **params: Any) -> Any:
    reply = client.get(url, params=params or None, headers=ADMIN)  # {} drops url's query
    assert reply.status_code == 200, reply.text
    return reply


# -- the jobs list and the job API: the current run's step time ----------------------


def test_the_jobs_list_shows_the_current_runs_step_time(client, relaunched):
    html = get(client, "/").text
    row = html.split(f'data-name="{JOB}"', 1)[1].split("</tr>", 1)[0]
    assert 'data-steptime="0.2"' in row
    assert "0.200 s" in row
    assert f'data-overview="/api/v1/jobs/{JOB}/overview?run=2"' in row  # its goodput too
    assert get(client, f"/api/v1/jobs/{JOB}").json()["step_time_median_s"] == 0.2


def test_the_job_page_shows_the_selected_runs_step_time(client, relaunched):
    assert step_time(get(client, f"/jobs/{JOB}").text) == "0.200 s"
    assert step_time(get(client, f"/jobs/{JOB}", run=1).text) == "1.000 s"


def step_time(html: str) -> str:
    found = re.search(r'id="step-time"[^>]*>([^<]*)<', html)
    assert found, "no median step time on the page"
    return found.group(1)


# -- the goodput panel: the selected run's ------------------------------------------


def test_the_goodput_panel_accounts_the_selected_run_alone(client, relaunched):
    for number in (1, 2):
        url = page_data(get(client, f"/jobs/{JOB}", run=number).text)["urls"]["overview"]
        assert url.endswith(f"/overview?run={number}")
        panel = get(client, url).json()["goodput"]
        alone = get(client, f"/api/v1/jobs/{JOB}/goodput", run=number).json()
        assert panel["run"] == number and panel["steps_productive"] == STEPS[number]
        assert panel["productive_s"] == pytest.approx(alone["productive_s"])
        assert panel["productive_s"] == pytest.approx(STEPS[number] * STEP_S[number], rel=0.01)
    # Without ?run= the overview is the whole job's, as before.
    everything = get(client, f"/api/v1/jobs/{JOB}/overview").json()["goodput"]
    job_wide = get(client, f"/api/v1/jobs/{JOB}/goodput").json()
    assert everything["run"] is None
    assert everything["productive_s"] == pytest.approx(job_wide["productive_s"])


@pytest.mark.parametrize(
    ("run", "status", "says"),
    [("3", 404, "job 'relaunched' has no run 3"), ("x", 422, '"run"'), ("0", 422, '"run"')],
)
def test_an_unknown_run_is_a_clear_4xx(client, relaunched, run, status, says):
    for url in (f"/api/v1/jobs/{JOB}/overview", f"/ui/jobs/{JOB}/stream"):
        reply = client.get(url, params={"run": run}, headers=ADMIN)
        assert reply.status_code == status, (url, reply.text)
        assert says in reply.text


# -- the incidents table: the selected run's, or every run's --------------------------


def incident_ids(html: str) -> set[int]:
    table = html.split('id="incidents"', 1)[1].split("</table>", 1)[0]
    return {int(i) for i in re.findall(r'data-id="(\d+)"', table)}


def test_the_incidents_table_lists_the_selected_runs_incidents(client, relaunched):
    mine = relaunched["incident"].id
    current = get(client, f"/jobs/{JOB}").text
    assert incident_ids(current) == set()
    assert 'id="incidents-scope"' in current and "?run=2&amp;incidents=all" in current
    assert incident_ids(get(client, f"/jobs/{JOB}", run=1).text) == {mine}
    assert incident_ids(get(client, f"/jobs/{JOB}", run=2, incidents="all").text) == {mine}
    api = get(client, f"/api/v1/jobs/{JOB}/incidents", run=2).json()
    assert api == []
    marks = get(client, f"/api/v1/jobs/{JOB}/overview", run=2).json()["incidents"]
    assert marks == []
    assert page_data(get(client, f"/jobs/{JOB}", incidents="all").text)["all_incidents"]


def test_the_open_incident_count_follows_the_table(client, relaunched):
    assert 'id="open-incidents">0<' in get(client, f"/jobs/{JOB}").text
    # Run 1 ended: its straggler is settled by the sweep, not yet here, so still open.
    assert 'id="open-incidents">1<' in get(client, f"/jobs/{JOB}", run=1).text


# -- the live step stream: the run's steps only ---------------------------------------


def stream(
    factory: Any, job: int, *, run: int, every_run: bool = False, **kwargs: Any
) -> list[tuple[str, dict[str, Any]]]:
    """Two polls of the page's live stream of run ``run``, parsed into ``(event, data)``."""
    with factory() as session:
        kwargs["scope"] = live.follow(session, job_id=job, job=JOB, run=run, every_run=every_run)
    polls = {"n": 0}

    async def gone() -> bool:
        polls["n"] += 1
        return polls["n"] > 2

    async def run() -> list[str]:
        events = live.job_events(factory, job, is_disconnected=gone, poll_s=0.01, **kwargs)
        return [chunk async for chunk in events]

    out = []
    for chunk in asyncio.run(run()):
        fields = dict(line.split(": ", 1) for line in chunk.strip().splitlines() if ": " in line)
        if "event" in fields:
            out.append((fields["event"], json.loads(fields["data"])))
    return out


def test_the_live_stream_of_a_run_sends_only_its_steps(client, session, relaunched):
    job, factory = relaunched["job_id"], client.app.state.sessionmaker
    signature = live.incident_signature(session, job)
    [(name, steps)] = stream(factory, job, run=2, after_step=-1, signature=signature)
    assert name == "steps" and steps["current_step"] == 59
    assert steps["step"] == list(range(60)) and set(steps["step_time"]) == {0.2}
    # Run 1 went on to step 119: none of that is run 2's news.
    assert stream(factory, job, run=2, after_step=59, signature=signature) == []


def test_the_stream_endpoint_follows_the_current_run_by_default(client, relaunched):
    for params in ({}, {"run": 2}):
        url = f"/ui/jobs/{JOB}/stream"
        with client.stream("GET", url, params={"after_step": 30, **params}) as reply:
            assert reply.status_code == 200
            data = next(line for line in reply.iter_lines() if line.startswith("data: "))
        steps = json.loads(data[6:])
        assert steps["step"] == list(range(31, 60)) and set(steps["step_time"]) == {0.2}


def test_the_live_stream_sends_the_runs_incidents_or_every_runs(client, session, relaunched):
    job, factory = relaunched["job_id"], client.app.state.sessionmaker
    mine = relaunched["incident"].id
    for scope, expected in (({"run": 2}, []), ({"run": 2, "every_run": True}, [mine])):
        events = dict(stream(factory, job, after_step=59, signature="", **scope))
        assert [i["id"] for i in events["incidents"]["incidents"]] == expected

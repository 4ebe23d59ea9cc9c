"""Live updates: the SSE generator sends new steps and incident changes, pings while
quiet, and stops when the browser goes away."""

from __future__ import annotations

import asyncio
import json

from backend.ui.stream import format_event, incident_signature, job_events, resume_point
from tests.frontend.helpers import detect, ingest_job, job_id


def collect(factory, job, *, after_step, signature, polls, heartbeat_s=60.0):  # type: ignore[no-untyped-def]
    """Run the generator for ``polls`` database polls; returns the parsed events."""
    calls = {"n": 0}

    async def gone() -> bool:
        calls["n"] += 1
        return calls["n"] > polls

    async def run() -> list[str]:
        chunks = []
        async for chunk in job_events(
            factory,
            job,
            after_step=after_step,
            signature=signature,
            is_disconnected=gone,
            poll_s=0.01,
            heartbeat_s=heartbeat_s,
        ):
            chunks.append(chunk)
        return chunks

    return asyncio.run(run())


def parse(chunks: list[str]) -> list[tuple[str, dict]]:  # type: ignore[type-arg]
    out = []
    for chunk in chunks:
        fields = dict(line.split(": ", 1) for line in chunk.strip().splitlines() if ": " in line)
        if "event" in fields:
            out.append((fields["event"], json.loads(fields["data"])))
    return out


def test_new_steps_and_incidents_become_events(client, session, session_factory, settings):
    ingest_job(client, steps=range(60), slow_rank=None)
    job = job_id(session)
    signature = incident_signature(session, job)
    # Nothing new since the page was rendered: no events, just the retry hint.
    chunks = collect(session_factory, job, after_step=59, signature=signature, polls=2)
    assert chunks == ["retry: 3000\n\n"]

    ingest_job(client, steps=range(60, 120), slow_rank=2, slow_from=60)
    detect(session, settings)
    events = parse(collect(session_factory, job, after_step=59, signature=signature, polls=3))
    names = [name for name, _ in events]
    assert names == ["steps", "incidents"]  # once each: later polls find nothing new
    steps = events[0][1]
    assert steps["current_step"] == 119 and steps["step"] == list(range(60, 120))
    assert steps["step_time"][0] == 0.4
    [incident] = events[1][1]["incidents"]
    assert (incident["kind"], incident["ranks"]) == ("straggler", [2])


def test_heartbeat_comment_while_quiet(client, session, session_factory):
    ingest_job(client, steps=range(5), slow_rank=None)
    job = job_id(session)
    sig = incident_signature(session, job)
    chunks = collect(session_factory, job, after_step=4, signature=sig, polls=3, heartbeat_s=0)
    assert ": ping\n\n" in chunks


def test_event_format_and_resume():
    text = format_event("steps", {"current_step": 3}, "3|1:2:x")
    assert text == 'event: steps\nid: 3|1:2:x\ndata: {"current_step":3}\n\n'

    class Req:
        headers = {"last-event-id": "42|1:7:2024"}

    assert resume_point(Req(), 5, "a") == (42, "1:7:2024")  # type: ignore[arg-type]
    Req.headers = {}
    assert resume_point(Req(), 5, "a") == (5, "a")  # type: ignore[arg-type]


def test_stream_endpoint(client):
    assert client.get("/ui/jobs/nope/stream").status_code == 404


def test_stream_endpoint_sends_events(client, session):
    ingest_job(client, steps=range(10), slow_rank=None)
    url = "/ui/jobs/llama-8b-pretrain/stream?after_step=4&incidents=x"
    with client.stream("GET", url) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        lines = []
        for line in reply.iter_lines():
            lines.append(line)
            if line.startswith("data: "):
                break
    assert "event: steps" in lines
    assert json.loads(lines[-1][6:])["current_step"] == 9

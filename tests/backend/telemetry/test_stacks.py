"""Stack dumps over REST: ``GET /api/v1/jobs/{job}/stacks`` and
``GET /api/v1/incidents/{id}/stacks`` return every rank's latest ``dump_stacks`` answer with
the training thread first and its innermost frame marked, and group the ranks stuck in the
same place (the odd one out first)."""

from __future__ import annotations

import time
from typing import Any

from backend.telemetry.stacks import parse_frame, training_thread
from tests.conftest import ADMIN
from tests.frontend import evidence_data as data
from tests.frontend.helpers import ingest_job


def stacks(client: Any, url: str) -> dict[str, Any]:
    reply = client.get(url, headers=ADMIN)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_job_stacks_mark_the_training_threads_innermost_frame(client, session, settings) -> None:  # type: ignore[no-untyped-def]
    data.seed_straggler(client, session, settings)
    out = stacks(client, f"/api/v1/jobs/{data.STRAGGLER}/stacks")
    assert [d["rank"] for d in out["dumps"]] == [0, 1, 2, 3] and out["ranks_with_dumps"] == 4
    dump = out["dumps"][0]
    assert dump["reason"] == "incident" and dump["step"] == 120
    main = dump["threads"][0]  # the training thread first
    assert (main["thread"], main["training"]) == ("MainThread", True)
    # Vigil's own threads come last (which ones depends on what else this process runs).
    infra = [t["thread"] for t in dump["threads"] if t["infra"]]
    assert "vigil-action" in infra and dump["threads"][-len(infra) :] == [
        t for t in dump["threads"] if t["infra"]
    ]
    hung = main["frames"][main["hung_frame"]]
    assert main["hung_frame"] == len(main["frames"]) - 1
    assert hung["file"].endswith("threading.py")  # waiting, as in a collective
    user = main["frames"][main["user_frame"]]
    assert user["function"] == "_dump_from_vigil_thread"
    assert user["code"].startswith("done.wait()  # this thread waits here")
    # Rank 2's training thread stands elsewhere: it is the group listed first.
    assert [g["ranks"] for g in out["groups"]] == [[2], [0, 1, 3]]


def test_incident_stacks_are_those_taken_since_it_opened(client, session) -> None:  # type: ignore[no-untyped-def]
    hang = data.seed_hang(client, session, time.time())
    data.post(client, data.HANG, 0, [data.stacks_event(data.waiting_in_all_reduce, 1000.0, 3)])
    out = stacks(client, f"/api/v1/incidents/{hang}/stacks")
    assert [d["rank"] for d in out["dumps"]] == [0, 1, 2, 3]
    assert all(d["step"] == 50 for d in out["dumps"])  # not the old dump of rank 0
    assert out["groups"][0]["ranks"] == [1]  # the culprit, stuck elsewhere
    job = stacks(client, f"/api/v1/jobs/{data.HANG}/stacks")
    assert job["dumps"][0]["step"] == 3  # the job's view: each rank's latest dump


def test_no_dumps_and_unknown_names(client) -> None:  # type: ignore[no-untyped-def]
    ingest_job(client, ranks=2, steps=range(5))
    assert stacks(client, "/api/v1/jobs/llama-8b-pretrain/stacks") == {
        "dumps": [],
        "ranks_with_dumps": 0,
        "groups": [],
    }
    assert client.get("/api/v1/jobs/nope/stacks", headers=ADMIN).status_code == 404
    assert client.get("/api/v1/incidents/999999/stacks", headers=ADMIN).status_code == 404


def test_malformed_dumps_from_a_rank_are_shown_not_trusted(client) -> None:  # type: ignore[no-untyped-def]
    odd = {"threads": [{"thread": "MainThread", "stack": ["not a frame", 7]}, "junk", {"x": 1}]}
    data.post(client, "odd", 0, [{"type": "event", "name": "stacks", "ts": 1.0, "attrs": odd}])
    data.post(
        client, "odd", 1, [{"type": "event", "name": "stacks", "ts": 1.0, "attrs": {"threads": 3}}]
    )
    out = stacks(client, "/api/v1/jobs/odd/stacks")
    first, second = out["dumps"]
    [thread] = first["threads"]
    assert thread["frames"] == [
        {"file": None, "line": None, "function": None, "code": "not a frame"}
    ]
    assert second["threads"] == [] and second["signature"] is None


def test_frames_parse_and_the_training_thread_is_not_vigils() -> None:
    text = '  File "/w/train.py", line 42, in step\n    loss = model(x)'
    assert parse_frame(text) == {
        "file": "/w/train.py",
        "line": 42,
        "function": "step",
        "code": "loss = model(x)",
    }
    frames = [parse_frame(text)]
    threads = [
        {"thread": "vigil-collector", "frames": frames * 9},
        {"thread": "loader", "frames": frames * 2},
        {"thread": "trainer", "frames": frames * 5},
    ]
    assert training_thread(threads) == 2  # deepest non-Vigil thread without a MainThread
    assert training_thread([*threads, {"thread": "MainThread", "frames": frames}]) == 3
    assert training_thread([threads[0]]) is None

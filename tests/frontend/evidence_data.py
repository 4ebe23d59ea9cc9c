"""Jobs whose incidents need each evidence view, built through the API and the detectors.

    ids = seed(client, session, settings, now=time.time())
    ids["nan"], ids["hang"], ids["comm_anomaly"], ids["flight_recorder"], ids["straggler"]

- ``STRAGGLER``: rank 2 of 4 slow from step 50 (the straggler detector names it; the policy
  proposes ``dump_stacks``, since no restart pays over the 32 s left of the run's 200 planned
  steps, ``run_plan``); four more incidents a few steps apart (their labels would collide on
  the step-time chart); stack dumps of every rank, rank 2's training thread somewhere else;
  ranks 1 and 3 reported ``collectives_untimed``.
- ``NAN``: loss NaN on every rank from step 60 (grad norm Inf on rank 1): the numerics
  detector's ``nan``.
- ``HANG``: steps stop at 49 while heartbeats go on; ranks 0, 2, 3 wait in all_reduce seq 50,
  rank 1 in none: the liveness sweep's ``hang`` naming rank 1, and stack dumps after it.
- ``COMM``: four dp groups, ``dp1`` at a third of the bandwidth from step 60: a
  ``comm_anomaly`` (incident from the comm detector's finding shape; the telemetry is real).
- ``FR``: PyTorch Flight Recorder dumps of a 16-rank job (``tests/data``) imported over REST.

Stack dumps come from the collector's own ``dump_stacks`` run on a ``vigil-action`` thread
while this thread (the "training thread") waits in a function of this file, as on a rank.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from backend.detection.runner import detect_job, sweep_job
from backend.importers.flight_recorder import upload_body
from backend.incidents.service import apply_findings
from backend.recovery import service as recovery
from backend.recovery.policies import put_policy
from backend.settings import Settings
from collector.actions import dump_stacks
from detectors.finding import Finding
from tests.conftest import INGEST
from tests.factories import batch
from tests.frontend.helpers import T0, ingest_job, job_id

STRAGGLER, NAN, HANG, COMM, FR = "ev-straggler", "ev-nan", "ev-hang", "ev-comm", "ev-fr"
TWO_RANKS = "ev-two-ranks"
FR_DUMPS = Path(__file__).parents[1] / "data" / "flight_recorder" / "lock_gil_1st"
UNTIMED_REASON = "a communication hook was registered before vigil.init()"


def post(client: Any, job: str, rank: int, events: list[dict[str, Any]], world: int = 4) -> None:
    # Python's json writes NaN/Infinity literals, as the collector does.
    body = json.dumps(batch(events, job=job, rank=rank, world_size=world))
    headers = {**INGEST, "Content-Type": "application/json"}
    reply = client.post("/api/v1/ingest", content=body, headers=headers)
    assert reply.status_code == 200, reply.text


class _Capture:
    """Stands in for the collector's client: keeps the event ``dump_stacks`` sends."""

    def __init__(self) -> None:
        self.attrs: dict[str, Any] = {}

    def event(self, name: str, **attrs: Any) -> None:
        assert name == "stacks"
        self.attrs = attrs


def _dump_from_vigil_thread() -> dict[str, Any]:
    capture, done = _Capture(), threading.Event()
    main = threading.get_ident()

    def dump_once_main_waits() -> None:
        # Dump only once this thread is blocked in ``done.wait()`` (Condition.wait inside,
        # on the same line twice running), so dumps from one call site have the same frames.
        deadline, last = time.monotonic() + 10, None
        while time.monotonic() < deadline:
            frame = sys._current_frames().get(main)
            outer = frame.f_back if frame is not None else None
            now = (
                (frame.f_code.co_name, frame.f_lineno, outer and outer.f_code.co_name)
                if frame
                else None
            )
            if now is not None and now[0] == now[2] == "wait" and now == last:
                break
            last = now
            time.sleep(0.005)
        dump_stacks(capture, {"reason": "incident"})
        done.set()

    threading.Thread(target=dump_once_main_waits, name="vigil-action").start()
    done.wait()  # this thread waits here, as a rank's training thread waits in a collective
    return capture.attrs


def waiting_in_all_reduce() -> dict[str, Any]:
    return _dump_from_vigil_thread()


def stuck_in_data_loader() -> dict[str, Any]:
    return _dump_from_vigil_thread()


def stacks_event(where: Callable[[], dict[str, Any]], ts: float, step: int) -> dict[str, Any]:
    return {"type": "event", "name": "stacks", "ts": ts, "step": step, "attrs": where()}


def _finding(kind: str, first: int, **extra: Any) -> Finding:
    fields: dict[str, Any] = {
        "severity": "warning",
        "ranks": (),
        "score": 1.0,
        "summary": f"{kind} since step {first}",
        "key": kind,
        "evidence": {},
    }
    fields.update(extra)
    return Finding(kind=kind, first_step=first, **fields)


def seed_straggler(client: Any, session: Session, settings: Settings) -> int:
    untimed = {"type": "event", "name": "collectives_untimed", "ts": T0}
    untimed["attrs"] = {"what": "ddp_gradients", "reason": UNTIMED_REASON}
    plan = {"type": "event", "name": "run_plan", "ts": T0, "attrs": {"total_steps": 200}}
    # Over the 32 s left of the run no restart pays: the policy proposes stacks instead.
    put_policy(
        session=session,
        job=STRAGGLER,
        kind="straggler",
        mode="approve",
        actor="test",
        actions=["restart", "dump_stacks"],
    )
    session.commit()  # (each write commits before the API writes: one SQLite writer at a time)
    ingest_job(client, STRAGGLER, extra=[plan])
    for rank in (1, 3):
        post(client, STRAGGLER, rank, [{**untimed, "attrs": {**untimed["attrs"], "rank": rank}}])
    jid = job_id(session, STRAGGLER)
    changes = detect_job(session=session, job_id=jid)
    recovery.respond(session=session, incidents=changes.opened, settings=settings)
    [straggler] = [i for i in changes.opened if i.kind == "straggler"]
    crowd = [  # incidents a few steps apart: their labels must not overlap
        _finding("loss_spike", 51, key="loss_spike"),
        _finding("memory_pressure", 52, ranks=(0,), key="memory_pressure:0"),
        _finding("opseq_change", 54),
        _finding("comm_anomaly", 55, key="comm_anomaly:group:dp"),
    ]
    apply_findings(session=session, job_id=jid, findings=crowd, covered_kinds=())
    session.commit()
    for rank in range(4):
        where = stuck_in_data_loader if rank == 2 else waiting_in_all_reduce
        post(client, STRAGGLER, rank, [stacks_event(where, T0 + 121, 120)])
    return straggler.id


def seed_nan(client: Any, session: Session) -> int:
    for rank in range(4):
        events = []
        for n in range(100):
            bad = n >= 60
            events.append(
                {
                    "type": "step",
                    "step": n,
                    "ts": T0 + n,
                    "duration_s": 0.4,
                    "comm_s": 0.1,
                    "loss": math.nan if bad else 3.0 - n * 0.01,
                    "grad_norm": math.inf if bad and rank == 1 else 1.0 + 0.1 * math.sin(n),
                }
            )
        post(client, NAN, rank, events)
    changes = detect_job(session=session, job_id=job_id(session, NAN))
    session.commit()
    [nan] = [i for i in changes.opened if i.kind == "nan"]
    return nan.id


def seed_hang(client: Any, session: Session, now: float) -> int:
    start = now - 60
    for rank in range(4):
        steps = [
            {
                "type": "step",
                "step": n,
                "ts": start + 0.3 * (n + 1),
                "duration_s": 0.3,
                "comm_s": 0.1,
            }
            for n in range(50)
        ]
        beat: dict[str, Any] = {"type": "heartbeat", "ts": now - 0.5, "step": 50}
        if rank != 1:
            beat["inflight"] = {"group": "world", "op": "all_reduce", "seq": 50, "since": now - 45}
        post(client, HANG, rank, [*steps, beat])
    changes = sweep_job(session=session, job_id=job_id(session, HANG), now=now)
    session.commit()
    [hang] = [i for i in changes.opened if i.kind == "hang"]
    for rank in range(4):
        where = stuck_in_data_loader if rank == 1 else waiting_in_all_reduce
        post(client, HANG, rank, [stacks_event(where, hang.detected_at.timestamp() + 1, 50)])
    return hang.id


def seed_comm(client: Any, session: Session) -> int:
    for rank in range(4):
        events = []
        for n in range(100):
            events.append(
                {"type": "step", "step": n, "ts": T0 + n, "duration_s": 0.4, "comm_s": 0.1}
            )
            for g in range(4):
                slow = g == 1 and n >= 60
                events.append(
                    {
                        "type": "collective",
                        "step": n,
                        "group": f"dp{g}",
                        "op": "all_reduce",
                        "bytes": 8_000_000,
                        "duration_s": 0.003 if slow else 0.001,
                        "count": 1,
                    }
                )
        post(client, COMM, rank, events)
    group = {"group": "dp1", "family": "dp/all_reduce", "bandwidth_gbps": 2.67}
    group.update({"reference_gbps": 8.0, "slower_x": 3.0, "onset_step": 60, "active": True})
    finding = _finding(
        "comm_anomaly", 60, ranks=(1,), key="comm_anomaly:rank:1", evidence={"slow_groups": [group]}
    )
    changes = apply_findings(
        session=session, job_id=job_id(session, COMM), findings=[finding], covered_kinds=()
    )
    session.commit()
    return changes.opened[0].id


def seed_flight_recorder(client: Any) -> int:
    reply = client.post(
        f"/api/v1/jobs/{FR}/imports/flight-recorder", json=upload_body(FR_DUMPS), headers=INGEST
    )
    assert reply.status_code == 200, reply.text
    return int(reply.json()["incident_id"])


def seed(client: Any, session: Session, settings: Settings, now: float) -> dict[str, int]:
    """Every scenario above (and a 2-rank job: ``TWO_RANKS``); the incident id of each."""
    ingest_job(client, TWO_RANKS, ranks=2, steps=range(40), slow_rank=None)
    return {
        "straggler": seed_straggler(client, session, settings),
        "nan": seed_nan(client, session),
        "hang": seed_hang(client, session, now),
        "comm_anomaly": seed_comm(client, session),
        "flight_recorder": seed_flight_recorder(client),
    }

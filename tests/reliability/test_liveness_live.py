"""Liveness in Redis with real processes (``vigil server`` + ``worker`` + ``beat`` on
PostgreSQL and Redis): heartbeats go to Redis and the rank rows are written at a low rate
(PostgreSQL's own row counters say so), and the worker's sweep still finds a crash and a
hang with the right ranks from what Redis holds."""

from __future__ import annotations

import time

import httpx
import pytest
from sqlalchemy import text

from backend.db import make_engine
from tests.conftest import ADMIN
from tests.factories import batch
from tests.reliability.stack import VigilStack, wait_for, wait_log

FAST = {"VIGIL_DETECT_INTERVAL_S": "0", "VIGIL_SWEEP_INTERVAL_S": "1"}
WORLD = 4


def rank_row_writes(db_url: str) -> int:
    """Rows PostgreSQL inserted or updated in ``ranks`` so far (its statistics)."""
    engine = make_engine(db_url)
    with engine.connect() as conn:
        n = conn.scalar(
            text("SELECT n_tup_ins + n_tup_upd FROM pg_stat_user_tables WHERE relname = 'ranks'")
        )
    engine.dispose()
    return int(n or 0)


def send(stack: VigilStack, job: str, rank: int, events: list[dict]) -> None:
    reply = stack.ingest(batch(events, job=job, rank=rank, world_size=WORLD))
    assert reply.status_code == 200, reply.text


def found(stack: VigilStack, job: str) -> list[tuple[str, list[int]]]:
    reply = httpx.get(f"{stack.base}/api/v1/jobs/{job}/incidents", headers=ADMIN, timeout=10)
    return [(i["kind"], i["ranks"]) for i in reply.json()] if reply.is_success else []


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_worker_finds_a_crash_and_a_hang_from_heartbeats_in_redis(
    tmp_path, reliability_db, reliability_redis
):
    stack = VigilStack(
        tmp_path,
        db_url=reliability_db,
        redis_url=reliability_redis,
        VIGIL_LIVENESS_STORE="redis",
        **FAST,
    )
    try:
        stack.start_worker()
        stack.start_beat()
        stack.start_server()
        wait_log(stack, "worker", " ready.", 60)
        before, beats, rounds, n = rank_row_writes(reliability_db), 0, 0, 31
        t0 = last = time.time()
        step = {"type": "step", "duration_s": 0.4, "comm_s": 0.1, "loss": 2.0}
        waiting = {"group": "world", "op": "all_reduce", "seq": 900, "since": t0 - 19}
        for rank in range(WORLD):
            # "crashing": steps up to now; "hung": steps stopped 20 s ago, heartbeats go on,
            # rank 2 outside the all-reduce the others wait in.
            crashing = [{**step, "step": n, "ts": t0 - 30 + n} for n in range(31)]
            send(stack, "crashing", rank, [*crashing, {"type": "heartbeat", "ts": t0}])
            hung = [{**step, "step": n, "ts": t0 - 80 + n} for n in range(61)]
            inflight = None if rank == 2 else waiting
            beat = {"type": "heartbeat", "ts": t0, "step": 61, "inflight": inflight}
            send(stack, "hung", rank, [*hung, beat])
            beats += 2
        gaps, first = [time.time() - t0], {}

        def beat_once() -> bool:
            nonlocal beats, rounds, n, last
            now, n, rounds = time.time(), n + 1, rounds + 1
            gaps.append(now - last)
            last = now
            for rank in (0, 1, 3):  # rank 2 of "crashing" has gone silent
                beat = {"type": "heartbeat", "ts": now, "step": n + 1}
                send(stack, "crashing", rank, [{**step, "step": n, "ts": now}, beat])
            for rank in range(WORLD):  # rank 2 of "hung" never entered the all-reduce
                inflight = None if rank == 2 else waiting
                beat = {"type": "heartbeat", "ts": now, "step": 61, "inflight": inflight}
                send(stack, "hung", rank, [beat])
            beats += 7
            for job in ("crashing", "hung"):
                if job not in first and (incidents := found(stack, job)):
                    first[job] = incidents
            time.sleep(0.3)
            return len(first) == 2 and rounds >= 15  # enough heartbeats to count writes

        wait_for(beat_once, 90, f"a crash and a hang\nworker:\n{stack.tail('worker')}")
        # (a gap between heartbeats over the 5 s crash timeout would be a crash: say so)
        why = f"longest gap between heartbeats: {max(gaps):.1f} s"
        assert first["crashing"] == [("crash", [2])], why
        assert first["hung"] == [("hang", [2])], why

        time.sleep(1.5)  # the server's statistics reach pg_stat (those of the last second
        # may not: fewer writes counted, but a write per heartbeat would still show)
        writes = rank_row_writes(reliability_db) - before
        print(f"liveness | {beats} heartbeat batches | {writes} rank rows written")
        assert writes < beats / 3, f"{beats} heartbeat batches wrote {writes} rank rows"
        shown = httpx.get(f"{stack.base}/api/v1/jobs/hung/ranks", headers=ADMIN).json()
        assert all(time.time() - r["last_heartbeat_ts"] < 10 for r in shown), shown
    finally:
        stack.stop()

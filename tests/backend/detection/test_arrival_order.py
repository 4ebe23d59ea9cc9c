"""Findings do not depend on the order batches arrive in (issue 15, item 2).

A job's telemetry is replayed through the ingest API in order (every rank's batch for a
flush, then detection), and again in adversarial orders with detection after *every*
batch: whole-rank bursts (one rank's backlog at once), the slow ranks' batches first at every
flush, every flush shuffled, round-robin with a lag that grows with the rank, and random
delays that also reorder one rank's own batches (a retried
batch after a later one). The incidents opened must be the same: same kinds, same ranks,
onsets within a few steps, and no rank named that the in-order replay did not name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
from sqlalchemy import select

from backend.detection.runner import detect_job
from backend.jobs.models import Job
from tests.backend.detection.test_runner import T0
from tests.conftest import ADMIN, INGEST
from tests.factories import batch

RANKS, STEPS, CHUNK = 8, 160, 20
SLOW, ONSET, FACTOR = (1, 4, 6), 80, 1.3
CHUNKS = STEPS // CHUNK
Order = Callable[[], Iterator[list[tuple[int, int]]]]


def _trace() -> np.ndarray:
    """(ranks, steps) compute seconds: a group of three ranks turns 1.3x slower."""
    rng = np.random.default_rng(4)
    compute = 0.3 * rng.normal(1.0, 0.01, (RANKS, STEPS))
    compute[list(SLOW), ONSET:] *= FACTOR
    return compute


def _post(client, job: str, compute: np.ndarray, rank: int, chunk: int) -> None:  # type: ignore[no-untyped-def]
    steps = range(chunk * CHUNK, (chunk + 1) * CHUNK)
    step_s = 0.6
    events: list[dict[str, object]] = [
        {
            "type": "step",
            "step": n,
            "ts": T0 + n * step_s,
            "duration_s": step_s,
            "comm_s": step_s - float(compute[rank, n]),
            "loss": 2.0,
        }
        for n in steps
    ]
    events.append({"type": "heartbeat", "ts": T0 + steps[-1] * step_s + 0.5, "step": steps[-1] + 1})
    reply = client.post(
        "/api/v1/ingest", json=batch(events, job=job, rank=rank, world_size=RANKS), headers=INGEST
    )
    assert reply.status_code == 200, reply.text


def in_order() -> Iterator[list[tuple[int, int]]]:
    for chunk in range(CHUNKS):
        yield [(rank, chunk) for rank in range(RANKS)]


def whole_rank_bursts() -> Iterator[list[tuple[int, int]]]:
    """Each rank in turn loses the network for three flushes, then its backlog lands at
    once (three flushes = 60 steps: within what detection holds back for)."""
    blip = {rank: range(1 + rank % 4, 4 + rank % 4) for rank in range(RANKS)}
    sent = dict.fromkeys(range(RANKS), 0)
    for tick in range(CHUNKS):
        for rank in (6, 1, 4, 0, 2, 3, 5, 7):
            if tick in blip[rank]:
                continue
            yield [(rank, chunk) for chunk in range(sent[rank], tick + 1)]
            sent[rank] = tick + 1
    for rank in range(RANKS):  # the network is back for everyone
        if sent[rank] < CHUNKS:
            yield [(rank, chunk) for chunk in range(sent[rank], CHUNKS)]


def slow_ranks_first() -> Iterator[list[tuple[int, int]]]:
    """Every flush, the slow group's batches land first, then the others one by one."""
    for chunk in range(CHUNKS):
        yield [(rank, chunk) for rank in SLOW]
        for rank in range(RANKS):
            if rank not in SLOW:
                yield [(rank, chunk)]


def each_flush_shuffled() -> Iterator[list[tuple[int, int]]]:
    rng = np.random.default_rng(5)
    for chunk in range(CHUNKS):
        for rank in rng.permutation(RANKS):
            yield [(int(rank), chunk)]


def round_robin_lagging() -> Iterator[list[tuple[int, int]]]:
    for tick in range(CHUNKS + 2):
        for rank in range(RANKS):
            lag = rank % 3  # up to two flushes (40 steps) behind
            if 0 <= tick - lag < CHUNKS:
                yield [(rank, tick - lag)]


def random_delays() -> Iterator[list[tuple[int, int]]]:
    rng = np.random.default_rng(11)
    # Delays of one flush on average, at most three (60 steps: within what detection holds
    # back for, ``detectors.settle.MAX_HOLD``).
    sent = [
        (chunk + min(rng.exponential(1.0), 3.0), rank, chunk)
        for rank in range(RANKS)
        for chunk in range(CHUNKS)
    ]
    for _, rank, chunk in sorted(sent):
        yield [(rank, chunk)]


Found = dict[tuple[str, tuple[int, ...]], list[int]]
_IN_ORDER: dict[str, tuple[Found, int]] = {}


def _replay(client, session, order: Order) -> tuple[Found, int]:  # type: ignore[no-untyped-def]
    """(kind, ranks) → the onsets of the incidents opened; and how often one resolved
    and re-opened along the way (flapping: a notification each time)."""
    compute, job = _trace(), f"arrival-{order.__name__}"
    # Every rank is alive throughout: collectors send heartbeats apart from telemetry, so a
    # rank whose batches are late still beats (here: once, dated at the end of the replay).
    for rank in range(RANKS):
        beat = {"type": "heartbeat", "ts": T0 + STEPS * 0.6, "step": 0}
        reply = client.post(
            "/api/v1/ingest",
            json=batch([beat], job=job, rank=rank, world_size=RANKS),
            headers=INGEST,
        )
        assert reply.status_code == 200, reply.text
    flaps = 0
    for arrivals in order():
        for rank, chunk in arrivals:
            _post(client, job, compute, rank, chunk)
        changes = detect_job(
            session=session, job_id=session.scalar(select(Job.id).where(Job.name == job))
        )
        flaps += len(changes.reopened)
        session.commit()
    opened: Found = {}
    for incident in client.get(f"/api/v1/jobs/{job}/incidents", headers=ADMIN).json():
        key = (incident["kind"], tuple(incident["ranks"]))
        opened.setdefault(key, []).append(incident["first_step"])
    return opened, flaps


@pytest.mark.parametrize(
    "order",
    [whole_rank_bursts, slow_ranks_first, each_flush_shuffled, round_robin_lagging, random_delays],
    ids=lambda f: f.__name__,
)
def test_findings_equal_an_in_order_replay(client, session, order: Order) -> None:  # type: ignore[no-untyped-def]
    dialect = session.get_bind().dialect.name
    if dialect not in _IN_ORDER:  # the reference replay, once per database
        _IN_ORDER[dialect] = _replay(client, session, in_order)
    expected, calm = _IN_ORDER[dialect]
    stragglers = {ranks for kind, ranks in expected if kind == "straggler"}
    assert stragglers == {(r,) for r in SLOW}, expected  # the in-order replay is right
    got, flaps = _replay(client, session, order)
    assert flaps == calm == 0, f"{flaps} incidents resolved and re-opened ({calm} in order)"
    assert set(got) == set(expected), {"in order": expected, order.__name__: got}
    for key, onsets in expected.items():
        assert len(got[key]) == len(onsets), (key, got[key], onsets)  # no re-opened episodes
        assert abs(min(got[key]) - min(onsets)) <= 5, (key, got[key], onsets)

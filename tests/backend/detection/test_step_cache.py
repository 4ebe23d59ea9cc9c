"""``load_steps`` reads only the step rows that may have changed since its last call for
the job (``backend.detection.step_cache``), and still returns what a full read returns:
batches arrive in any order, a rank crashes, whole steps arrive late, the window slides,
the job restarts, another job takes its id."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import timedelta

import numpy as np
import pytest
from sqlalchemy import delete, event, select, update

from backend.detection.window import load_steps
from backend.jobs.models import Job
from backend.telemetry.models import StepRecord
from detectors.window import StepWindow
from tests.conftest import INGEST
from tests.factories import batch

T0 = 1_700_000_000.0


def post(client, job: str, rank: int, steps: range, *, world: int, attempt: int = 0) -> None:  # type: ignore[no-untyped-def]
    """One rank's batch of ``steps``, with values that differ per cell, some not sent, some
    NaN, so every array and flag of the window is exercised."""
    rng = np.random.default_rng(rank * 100_003 + steps.start)
    events: list[dict[str, object]] = []
    for n in steps:
        event: dict[str, object] = {
            "type": "step",
            "step": n,
            "ts": T0 + n,
            "duration_s": float(rng.uniform(0.2, 0.4)),
        }
        for name in ("comm_s", "data_s", "loss", "grad_norm", "mem_bytes"):
            draw = rng.random()
            if draw < 0.8:
                event[name] = int(1e9 * draw) if name == "mem_bytes" else float(draw)
            elif draw < 0.85 and name in ("loss", "grad_norm"):
                event[name] = float("nan")
        events.append(event)
    body = json.dumps(batch(events, job=job, rank=rank, world_size=world, attempt=attempt))
    reply = client.post(
        "/api/v1/ingest", content=body, headers={**INGEST, "Content-Type": "application/json"}
    )
    assert reply.status_code == 200, reply.text


def job_id(session, name: str) -> int:  # type: ignore[no-untyped-def]
    found = session.scalar(select(Job.id).where(Job.name == name))
    assert found is not None
    return int(found)


def assert_same(got: StepWindow | None, full: StepWindow | None) -> None:
    """Every field equal, arrays with their NaNs and dtypes."""
    if got is None or full is None:
        assert got is full
        return
    for f in dataclasses.fields(StepWindow):
        a, b = getattr(got, f.name), getattr(full, f.name)
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), f.name
            assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True), f.name
        else:
            assert a == b, f.name


def check(session, jid: int, width: int) -> StepWindow | None:  # type: ignore[no-untyped-def]
    """The cached load, checked against a full read."""
    got = load_steps(session=session, job_id=jid, width=width)
    assert_same(got, load_steps(session=session, job_id=jid, width=width, cached=False))
    return got


RANKS, CHUNK, CHUNKS, WIDTH = 6, 5, 12, 20
Order = Iterator[tuple[int, int]]


def delayed(rng: np.random.Generator, crashed: int | None = None) -> Order:
    """(rank, chunk) batches, each late by a random delay of up to four flushes, so that a
    rank's own batches swap and whole steps land after later ones; ``crashed`` stops
    after chunk 5 (its later steps stay incomplete)."""
    sent = [
        (chunk + min(rng.exponential(1.5), 4.0), rank, chunk)
        for rank in range(RANKS)
        for chunk in range(CHUNKS)
        if rank != crashed or chunk <= 5
    ]
    for _, rank, chunk in sorted(sent):
        yield rank, chunk


def crashed(rng: np.random.Generator) -> Order:
    return delayed(rng, crashed=4)


def whole_flushes_late(rng: np.random.Generator) -> Order:
    """Every rank's batch of a flush together, the flushes late by up to three: steps
    land whole after later ones, into gaps in a full window."""
    late = sorted((chunk + rng.uniform(0, 3), chunk) for chunk in range(CHUNKS))
    for _, chunk in late:
        for rank in rng.permutation(RANKS):
            yield int(rank), chunk


def shuffled(rng: np.random.Generator) -> Order:
    pairs = [(rank, chunk) for rank in range(RANKS) for chunk in range(CHUNKS)]
    for i in rng.permutation(len(pairs)):
        yield pairs[i]


@pytest.mark.parametrize("order", [delayed, crashed, whole_flushes_late, shuffled])
def test_equals_a_full_read_in_any_arrival_order(client, session, order):
    name = f"arrivals-{order.__name__}"
    for rank, chunk in order(np.random.default_rng(7)):
        post(client, name, rank, range(chunk * CHUNK, (chunk + 1) * CHUNK), world=RANKS)
        check(session, job_id(session, name), WIDTH)


def test_a_late_step_in_a_gap_is_read(client, session):
    # One rank: every step that has a row is complete. Steps 15-19 land after 20-24,
    # when the window (10 steps) is full: they fill a gap and must be read.
    for first in (0, 5, 10, 20, 15, 25):
        post(client, "gap", 0, range(first, first + 5), world=1)
        window = check(session, job_id(session, "gap"), 10)
    assert window is not None and window.steps.tolist() == list(range(20, 30))


class RowsRead:
    """Counts the rows the step-row query reads: each such statement, captured as sent,
    is run again once the call is over."""

    def __init__(self, session) -> None:  # type: ignore[no-untyped-def]
        self.connection = session.connection()
        self.sent: list[tuple[str, object]] = []
        event.listen(self.connection, "before_cursor_execute", self._capture)

    def _capture(self, conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("SELECT") and "duration_s" in statement:
            self.sent.append((statement, parameters))

    def __call__(self, load) -> int:  # type: ignore[no-untyped-def]
        self.sent.clear()
        load()
        sent, self.sent = self.sent, []
        return sum(len(self.connection.exec_driver_sql(s, p).all()) for s, p in sent)  # type: ignore[arg-type]


def test_a_warm_call_reads_only_new_rows(client, session):
    ranks, width = 4, 20
    for rank in range(ranks):
        post(client, "warm", rank, range(30), world=ranks)
    jid = job_id(session, "warm")
    rows_read = RowsRead(session)
    load = lambda: load_steps(session=session, job_id=jid, width=width)  # noqa: E731
    assert rows_read(load) == ranks * width  # the first call reads the window
    assert rows_read(load) == 0  # nothing new

    for rank in range(ranks):
        post(client, "warm", rank, range(30, 31), world=ranks)
    assert rows_read(load) == ranks  # one new step: its rows only

    for rank in range(ranks - 1):  # step 31 from all but the last rank: incomplete
        post(client, "warm", rank, range(31, 32), world=ranks)
    assert rows_read(load) == ranks - 1
    assert rows_read(load) == ranks - 1  # read again until it is complete
    post(client, "warm", ranks - 1, range(31, 32), world=ranks)
    assert rows_read(load) == ranks  # read whole once more, then never again
    assert rows_read(load) == 0
    assert_same(load(), load_steps(session=session, job_id=jid, width=width, cached=False))


def test_the_window_slides_and_a_restart_starts_afresh(client, session):
    from backend.detection import step_cache

    ranks, width = 3, 10
    for chunk in range(8):
        for rank in range(ranks):
            post(client, "slide", rank, range(chunk * 5, chunk * 5 + 5), world=ranks)
        jid = job_id(session, "slide")
        window = check(session, jid, width)
        assert window is not None
        assert list(step_cache._kept[jid].steps) == window.steps.tolist()  # old steps left
    assert window.steps.tolist() == list(range(30, 40))

    for rank in range(ranks):  # the job restarts: attempt 1 numbers its steps from 0 again
        post(client, "slide", rank, range(5), world=ranks, attempt=1)
    window = check(session, jid, width)
    assert window is not None and window.steps.tolist() == list(range(5))
    assert list(step_cache._kept[jid].steps) == list(range(5))


def test_another_job_under_the_same_id_starts_afresh(client, session):
    for rank in range(2):
        post(client, "reused", rank, range(12), world=2)
    jid = job_id(session, "reused")
    before = check(session, jid, 10)
    # The job goes and another one gets its id: new rows, a later creation time.
    session.execute(delete(StepRecord).where(StepRecord.job_id == jid))
    created = session.scalar(select(Job.created_at).where(Job.id == jid))
    session.execute(update(Job).where(Job.id == jid).values(created_at=created + timedelta(1)))
    session.add_all(
        StepRecord(job_id=jid, rank=r, attempt=0, step=s, ts=T0 + s, duration_s=1.0 + s)
        for r in range(2)
        for s in range(3, 15)
    )
    session.flush()
    after = check(session, jid, 10)
    assert before is not None and after is not None
    assert after.steps.tolist() == list(range(5, 15))
    assert np.all(after.step_time == 1.0 + after.steps)


def test_memory_is_bounded(client, session, monkeypatch):
    from backend.detection import step_cache

    monkeypatch.setattr(step_cache, "MAX_JOBS", 2)
    ids = []
    for name in ("a", "b", "c"):
        post(client, name, 0, range(10), world=1)
        ids.append(job_id(session, name))
        check(session, ids[-1], 10)
    assert list(step_cache._kept)[-2:] == ids[1:] and ids[0] not in step_cache._kept

    monkeypatch.setattr(step_cache, "MAX_ROWS", 5)  # a job bigger than that is not kept
    check(session, ids[0], 10)
    assert ids[0] not in step_cache._kept

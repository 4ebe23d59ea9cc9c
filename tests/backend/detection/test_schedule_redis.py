"""Distributed scheduling against a real Redis: a detection request stays pending until a
run that saw it succeeds; requests that arrive during a run keep the job pending; a run
lost with its worker is re-queued once it is two intervals old, once per two intervals;
tasks queued behind a slower run have nothing left to do once a run began after them.
(The same with real workers killed and Redis restarted: tests/reliability/.)"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from redis import Redis

from backend.celery_app import configure
from backend.detection import schedule
from backend.settings import Settings
from tests.reliability.services import REDIS_SERVER, RedisServer

INTERVAL = 5.0


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One Redis for the module: Celery keeps its producer pool bound to the first URL."""
    if REDIS_SERVER is not None:
        server = RedisServer(tmp_path_factory.mktemp("redis"))
        server.start()
        yield server.url
        server.stop(kill=True)
        return
    url = os.environ.get("VIGIL_TEST_REDIS_URL")
    if not url:
        pytest.skip("needs redis-server or VIGIL_TEST_REDIS_URL")
    yield url


@pytest.fixture
def redis(redis_url: str, sqlite_url: str) -> Iterator[Redis]:
    settings = Settings(database_url=sqlite_url, redis_url=redis_url, detect_interval_s=INTERVAL)
    configure(settings)
    client = Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()
    configure(Settings(database_url=sqlite_url))  # back to eager for the other tests


def queued_tasks(redis: Redis) -> int:
    return int(redis.llen("vigil"))


def test_a_request_is_pending_until_a_run_that_saw_it_succeeds(redis):
    schedule.queue_detection(7)
    schedule.queue_detection(7)  # debounced: one run queued for both
    assert queued_tasks(redis) == 1
    assert schedule.pending_lag()[1] == 1

    seen = schedule.begin(7)
    schedule.queue_detection(7)  # new data while the run goes on
    schedule.served(7, seen, started=1.0)
    assert schedule.pending_lag()[1] == 1, "data that came during the run was dropped"

    seen = schedule.begin(7)
    schedule.served(7, seen, started=2.0)
    assert schedule.pending_lag() == (0.0, 0)


def test_a_lost_run_is_requeued_after_two_intervals_once_per_two_intervals(redis):
    schedule.queue_detection(7)
    now = float(redis.zscore(schedule.PENDING, "7"))
    assert schedule.requeue_overdue(now + INTERVAL) == []  # not overdue yet
    assert schedule.requeue_overdue(now + 2.5 * INTERVAL) == [7]
    assert schedule.requeue_overdue(now + 3 * INTERVAL) == []  # already re-queued
    redis.delete(schedule.requeued_key(7))  # two intervals later
    assert schedule.requeue_overdue(now + 5 * INTERVAL) == [7]
    assert schedule.pending_lag(now + 5 * INTERVAL)[0] == pytest.approx(5 * INTERVAL)


def test_the_debounce_key_lives_two_intervals_not_minutes(redis):
    schedule.queue_detection(7)
    ttl_ms = redis.pttl(schedule.queued_key(7))
    assert 0 < ttl_ms <= 2 * INTERVAL * 1000


def test_tasks_queued_before_a_run_began_are_redundant_later_ones_are_not(redis):
    """Runs slower than the debounce: a task is queued every two intervals while the first
    waits. Once one of them runs, the others were covered by it and must return at once
    (else they pile up, run after run, and the sweeps expire behind them); a task sent
    for data that came after that run began is not covered."""
    for _ in range(3):  # the debounce key expired between requests: three tasks queued
        schedule.queue_detection(7)
        redis.delete(schedule.queued_key(7))
    assert queued_tasks(redis) == 3
    assert [schedule.redundant(7, t) for t in (1, 2, 3)] == [False, False, False]

    schedule.begin(7)  # task 1 runs
    assert [schedule.redundant(7, t) for t in (1, 2, 3)] == [True, True, True]
    schedule.queue_detection(7)  # data while it runs: a fresh task
    assert queued_tasks(redis) == 4
    assert not schedule.redundant(7, 4)
    assert not schedule.redundant(8, 1)  # another job's tickets are its own
    assert not schedule.redundant(7, None)  # a task queued before tickets: runs

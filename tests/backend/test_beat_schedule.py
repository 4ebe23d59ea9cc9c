"""Periodic tasks and their expiry: a sweep queued behind detection runs must still run.

Seen in a 1,024-rank load run (bench/README.md, "Through relays"): detection runs took
~5 s each on the worker, the 2-s sweep expired after 2 s in the queue, 14 of 39 sweeps
were discarded unrun ("Discarding revoked task: vigil.sweep") and neither the hang nor
the crash was found.
"""

from __future__ import annotations

from backend.celery_app import EXPIRES_FLOOR_S, beat_schedule
from backend.settings import Settings


def test_a_sweep_waiting_behind_slow_detection_runs_is_not_dropped() -> None:
    settings = Settings(database_url="sqlite://", sweep_interval_s=2.0)
    sweep = beat_schedule(settings)["vigil.sweep"]
    assert sweep["schedule"] == 2.0
    assert sweep["options"]["expires"] >= 5 * 2.0  # detection runs of ~5 s ahead of it
    assert sweep["options"]["expires"] == EXPIRES_FLOOR_S


def test_a_stale_backlog_is_still_dropped() -> None:
    """After a worker outage, a task older than its period and the floor is not run."""
    schedule = beat_schedule(Settings(database_url="sqlite://"))
    for name, entry in schedule.items():
        expires = entry["options"]["expires"]
        assert expires == max(entry["schedule"], EXPIRES_FLOOR_S), name
        assert expires <= max(entry["schedule"], 60.0), name

"""One broken detector must not blind the others: its failure is logged with the job and
the detector's name and counted in /metrics; the other detectors' incidents open and
resolve as before; the broken detector's own open incidents are left as they were."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from backend.detection.runner import detect_job
from backend.incidents.service import apply_findings
from detectors import registry
from detectors.finding import Finding
from tests.backend.detection.test_runner import JOB, incidents, job_id, post_steps


def _break(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Replace detector ``name`` by one that raises, as a validation bug would."""
    (detector,) = [d for d in registry.detectors() if d.name == name]

    def boom(window: object) -> list[Finding]:
        raise ValueError("steps must be increasing")

    monkeypatch.setitem(registry._DETECTORS, name, dataclasses.replace(detector, detect=boom))


def _failures(client, detector: str) -> float:  # type: ignore[no-untyped-def]
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f'vigil_detector_failures_total{{detector="{detector}"}}'):
            return float(line.split()[-1])
    return 0.0


def _seed_open(session, kind: str, key: str) -> None:  # type: ignore[no-untyped-def]
    finding = Finding(
        kind=kind, severity="warning", ranks=(2,), first_step=10, score=5.0, summary=key, key=key
    )
    apply_findings(session=session, job_id=job_id(session), findings=[finding], covered_kinds=())
    session.commit()


def test_a_raising_detector_does_not_stop_the_others_from_opening(
    client, session, monkeypatch, caplog
):  # type: ignore[no-untyped-def]
    post_steps(client, slow_rank=2)
    _break(monkeypatch, "numerics")
    before = _failures(client, "numerics")
    with caplog.at_level(logging.ERROR, logger="backend.detection.runner"):
        detect_job(session=session, job_id=job_id(session))
        session.commit()
    [incident] = incidents(client)
    assert (incident["kind"], incident["ranks"], incident["status"]) == ("straggler", [2], "open")
    assert _failures(client, "numerics") == before + 1
    [record] = [r for r in caplog.records if "failed on job" in r.getMessage()]
    assert "numerics" in record.getMessage() and JOB in record.getMessage()
    assert record.exc_info is not None and "steps must be increasing" in str(record.exc_info[1])


def test_others_resolve_as_before_and_the_broken_ones_incidents_stay_open(
    client, session, monkeypatch
):  # type: ignore[no-untyped-def]
    post_steps(client)  # a clean job: nothing is detected now
    _seed_open(session, "straggler", "straggler:2")
    _seed_open(session, "nan", "nan")
    _break(monkeypatch, "numerics")
    changes = detect_job(session=session, job_id=job_id(session))
    session.commit()
    status = {i["kind"]: i["status"] for i in incidents(client)}
    # The straggler detector looked and found nothing: resolved, as without the failure.
    assert status["straggler"] == "resolved"
    # The NaN detector failed: it did not look, so its incident is not resolved by omission.
    assert status["nan"] == "open"
    assert [row.kind for row in changes.resolved] == ["straggler"]


def test_without_the_failure_both_resolve(client, session):  # type: ignore[no-untyped-def]
    """The control for the test above: the same data with every detector working."""
    post_steps(client)
    _seed_open(session, "straggler", "straggler:2")
    _seed_open(session, "nan", "nan")
    detect_job(session=session, job_id=job_id(session))
    session.commit()
    assert {i["kind"]: i["status"] for i in incidents(client)} == {
        "straggler": "resolved",
        "nan": "resolved",
    }


def _runs(client, detector: str, outcome: str) -> float:  # type: ignore[no-untyped-def]
    want = f'vigil_detector_runs_total{{detector="{detector}",outcome="{outcome}"}}'
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(want):
            return float(line.split()[-1])
    return 0.0


def test_every_detector_run_is_counted_by_outcome(client, session, monkeypatch):  # type: ignore[no-untyped-def]
    post_steps(client, slow_rank=2)
    _break(monkeypatch, "numerics")
    before = {d: _runs(client, d, o) for d, o in [("numerics", "failed"), ("straggler", "ok")]}
    detect_job(session=session, job_id=job_id(session))
    session.commit()
    assert _runs(client, "numerics", "failed") == before["numerics"] + 1
    assert _runs(client, "straggler", "ok") == before["straggler"] + 1


def test_detector_runs_in_the_workers_reach_the_apis_metrics_through_redis():
    """Distributed mode: the workers run detection, the API answers /metrics."""
    import os

    from redis import Redis

    from backend.metrics import DetectorRuns

    url = os.environ.get("VIGIL_TEST_REDIS_URL")
    if not url:
        pytest.skip("needs VIGIL_TEST_REDIS_URL (a Redis to use)")
    redis = Redis.from_url(url)
    redis.delete(DetectorRuns.KEY)
    worker, api = DetectorRuns(), DetectorRuns()  # two processes' collectors
    worker.record("straggler", "ok", redis)
    worker.record("straggler", "ok", redis)
    worker.record("hang", "failed", redis)
    api.shared = lambda: redis
    [family] = list(api.collect())
    got = {(s.labels["detector"], s.labels["outcome"]): s.value for s in family.samples}
    assert got == {("straggler", "ok"): 2.0, ("hang", "failed"): 1.0}
    redis.delete(DetectorRuns.KEY)

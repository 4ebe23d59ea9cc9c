"""``GET /api/v1/incidents/{id}/evidence-chart`` picks the chart that fits the incident:
loss and grad norm for ``nan``, each rank's last steps and heartbeat for ``hang``, slow
groups' bandwidth for ``comm_anomaly``, compute vs the median for a straggler, nothing for a
Flight Recorder import (its table is on the page)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from backend.telemetry.evidence import LIVENESS_STEPS
from tests.frontend import evidence_data as data


def chart(client: Any, incident_id: int) -> dict[str, Any]:
    reply = client.get(f"/api/v1/incidents/{incident_id}/evidence-chart")
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_nan_incident_charts_loss_and_grad_norm_with_nonfinite_steps(client, session) -> None:  # type: ignore[no-untyped-def]
    d = chart(client, data.seed_nan(client, session))
    assert d["chart"] == "numerics" and d["first_step"] == 60
    assert "median" not in d and "ranks" not in d  # no compute chart
    finite = dict(zip(d["step"], d["loss"], strict=True))
    assert finite[59] == pytest.approx(3.0 - 0.59) and finite[60] is None
    assert d["nonfinite"]["loss"][0] == 60 and 99 in d["nonfinite"]["loss"]
    assert d["nonfinite"]["grad_norm"][0] == 60  # Inf on rank 1
    assert d["grad_norm"][d["step"].index(60)] is not None  # the other ranks' median


def test_hang_incident_charts_each_ranks_last_steps_and_heartbeat(client, session) -> None:  # type: ignore[no-untyped-def]
    now = time.time()
    d = chart(client, data.seed_hang(client, session, now))
    assert d["chart"] == "liveness"
    ranks = {r["rank"]: r for r in d["liveness"]}
    assert sorted(ranks) == [0, 1, 2, 3]
    assert [r for r, v in ranks.items() if v["named"]] == [1]  # the culprit
    assert ranks[1]["inflight"] is None and ranks[0]["inflight"] == "world all_reduce #50"
    last = ranks[0]
    assert last["step"][-1] == 49 and len(last["step"]) == LIVENESS_STEPS
    # Steps ended ~45 s before detection; the heartbeat came just before it.
    assert last["step_end_s"][-1] < -30 and -5 < last["heartbeat_s"] <= 0


def test_comm_incident_charts_the_slow_group_against_the_others(client, session) -> None:  # type: ignore[no-untyped-def]
    d = chart(client, data.seed_comm(client, session))
    assert d["chart"] == "bandwidth"
    slow, others = d["groups"]
    assert (slow["group"], slow["slow"], others["slow"]) == ("dp1", True, False)
    at = slow["step"]
    before, after = at.index(50), at.index(70)
    assert slow["gbps"][after] == pytest.approx(slow["gbps"][before] / 3, rel=0.01)
    assert others["gbps"][after] == pytest.approx(others["gbps"][before])


def test_straggler_keeps_compute_against_the_median(client, session, settings) -> None:  # type: ignore[no-untyped-def]
    d = chart(client, data.seed_straggler(client, session, settings))
    assert d["chart"] == "compute" and [r["rank"] for r in d["ranks"]] == [2]
    assert len(d["median"]) == len(d["step"]) > 0


def test_flight_recorder_incident_has_no_chart(client) -> None:  # type: ignore[no-untyped-def]
    d = chart(client, data.seed_flight_recorder(client))
    assert d == {"chart": "none", "first_step": None}

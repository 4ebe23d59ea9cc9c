"""SLOs over REST: CRUD with clear errors, and their figures from ingested requests —
attainment (joint and per threshold), goodput, error budget, burn rates — kept at ingest
and recomputed when the SLO changes."""

from __future__ import annotations

import time

import pytest

from tests.conftest import ADMIN, INGEST
from tests.factories import batch

JOB = "chat"


def req(i: int, *, at: float, ttft: float, tpot: float, tokens: int = 11, status: str = "ok"):  # type: ignore[no-untyped-def]
    first = at + ttft
    return {
        "type": "request",
        "id": f"r-{i}",
        "arrival": at,
        "first_token": first,
        "end": first + tpot * (tokens - 1),
        "prompt_tokens": 50,
        "output_tokens": tokens,
        "status": status,
        "replica": "r0",
    }


def ingest(client, events):  # type: ignore[no-untyped-def]
    reply = client.post(
        "/api/v1/ingest", json=batch(events, job=JOB, kind="serving"), headers=INGEST
    )
    assert reply.status_code == 200, reply.text


def make_slo(client, **fields):  # type: ignore[no-untyped-def]
    body = {"job": JOB, "name": "interactive", "ttft_s": 0.5, "tpot_s": 0.05, **fields}
    return client.post("/api/v1/slos", json=body, headers=ADMIN)


def mixed_traffic(client, now: float) -> None:
    """100 requests in the last ten minutes: 80 good, 10 slow to first token, 5 slow per
    token, 5 errors."""
    events = []
    for i in range(100):
        at = now - 600 + i * 5
        ttft, tpot, status = 0.2, 0.02, "ok"
        if i % 10 == 0:
            ttft = 0.9
        elif i % 20 == 1:
            tpot = 0.2
        elif i % 20 == 3:
            status = "error"
        events.append(req(i, at=at, ttft=ttft, tpot=tpot, status=status))
    ingest(client, events)


def test_crud_and_clear_errors(client):
    created = make_slo(client)
    assert created.status_code == 201, created.text
    slo = created.json()
    assert (slo["objective"], slo["period_s"], slo["e2e_s"]) == (0.99, 28 * 86400, None)
    again = make_slo(client)
    assert again.status_code == 409 and again.json()["error"] == "conflict"
    none = make_slo(client, name="empty", ttft_s=None, tpot_s=None)
    assert none.status_code == 422 and "at least one threshold" in none.json()["detail"]
    bad = make_slo(client, name="x", objective=1.5)
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "objective"
    listed = client.get("/api/v1/slos", params={"job": JOB}, headers=ADMIN).json()
    assert [s["name"] for s in listed] == ["interactive"]
    patched = client.patch(f"/api/v1/slos/{slo['id']}", json={"e2e_s": 5.0}, headers=ADMIN)
    assert patched.status_code == 200 and patched.json()["e2e_s"] == 5.0
    cleared = client.patch(
        f"/api/v1/slos/{slo['id']}",
        json={"ttft_s": None, "tpot_s": None, "e2e_s": None},
        headers=ADMIN,
    )
    assert cleared.status_code == 422
    assert client.delete(f"/api/v1/slos/{slo['id']}", headers=ADMIN).status_code == 204
    assert client.get(f"/api/v1/slos/{slo['id']}", headers=ADMIN).status_code == 404


def test_a_write_needs_the_admin_scope(client):
    reply = client.post("/api/v1/slos", json={"job": JOB, "name": "x", "ttft_s": 1}, headers=INGEST)
    assert reply.status_code == 403


def test_attainment_goodput_and_budget_from_ingested_requests(client):
    now = time.time()
    assert make_slo(client).status_code == 201  # before the traffic: counted at ingest
    mixed_traffic(client, now)
    [status] = client.get(f"/api/v1/jobs/{JOB}/slos", headers=ADMIN).json()
    assert status["requests"] == 100
    assert status["attainment"] == pytest.approx(0.80)
    by = status["attainment_by_threshold"]
    # Errors miss every threshold; slow TTFT misses only TTFT; slow TPOT only TPOT.
    assert by["ttft_s"] == pytest.approx(0.85) and by["tpot_s"] == pytest.approx(0.90)
    # 20% bad against a 1% budget: the budget is spent 20 times over.
    assert status["error_budget_remaining"] == pytest.approx(1 - 0.20 / 0.01)
    window = client.get(
        f"/api/v1/jobs/{JOB}/slos",
        params={"since": now - 700, "until": now},
        headers=ADMIN,
    ).json()[0]
    assert window["goodput_rps"] == pytest.approx(80 / 700)
    assert window["goodput_tokens_per_s"] == pytest.approx(80 * 11 / 700)
    burn = {b["tier"]: b for b in status["burn_rates"]}
    # Every request is inside the slow page tier's windows (5h36m / 28m for 28 days):
    # 20% bad is a burn rate of 20, above its 6x. (The fast tier's 5-minute window holds
    # only the last few minutes: whether it fires depends on where the minutes fall.)
    slow = burn["page-slow"]
    assert (slow["long_total"], slow["long_burn_rate"], slow["firing"]) == (100, 20.0, True)


def test_an_slo_created_later_counts_the_stored_requests_and_a_change_recounts(client):
    now = time.time()
    mixed_traffic(client, now)
    slo = make_slo(client).json()  # after the traffic: computed from stored requests
    [status] = client.get(f"/api/v1/jobs/{JOB}/slos", headers=ADMIN).json()
    assert (status["requests"], status["attainment"]) == (100, pytest.approx(0.80))
    client.patch(f"/api/v1/slos/{slo['id']}", json={"ttft_s": 1.0}, headers=ADMIN)
    [status] = client.get(f"/api/v1/jobs/{JOB}/slos", headers=ADMIN).json()
    assert status["attainment"] == pytest.approx(0.90)  # slow-TTFT requests now meet it


def test_an_slo_for_one_model_ignores_the_others(client):
    now = time.time()
    make_slo(client, model="big")
    events = [req(i, at=now - 100 + i, ttft=0.2, tpot=0.02) for i in range(10)]
    events[0]["model"] = "big"
    ingest(client, events)
    [status] = client.get(f"/api/v1/jobs/{JOB}/slos", headers=ADMIN).json()
    assert status["requests"] == 1

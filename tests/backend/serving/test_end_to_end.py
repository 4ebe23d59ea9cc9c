"""A serving fleet with one slow replica, end to end: ``vigil server`` (a real process),
three instrumented model servers, the Azure trace replayed round-robin by ``vigil
replay``'s client. Vigil names the slow replica, pages on the SLO burn, tells the webhook,
and both incidents resolve once the slow replica is gone; Vigil's figures for the client's records
agree with the client's own. About six minutes (``slow_replica`` needs 3 slow minutes, then
both incidents must resolve)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from backend.demo.serving_fleet import (
    Fleet,
    ServingScenario,
    calibrate,
    configure,
    run_load,
    server_figures,
)
from backend.serving.replay import finish_shipping, ship_to
from backend.serving.report import summarize
from backend.settings import DEV_ADMIN_TOKEN, DEV_INGEST_TOKEN
from tests.servers import Receiver, live_server

# About four minutes on an idle box: more than the suite-wide 300 s timeout allows under load.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_a_slow_replica_is_named_paged_on_and_cleared(sqlite_url: str):
    scenario = ServingScenario(job="e2e")
    env = {"VIGIL_DETECT_INTERVAL_S": "1", "VIGIL_SWEEP_INTERVAL_S": "1"}
    with (
        live_server(sqlite_url, **env) as base,
        Receiver() as rx,
        Fleet(scenario, endpoint=base, token=DEV_INGEST_TOKEN) as fleet,
    ):
        th = calibrate(fleet.urls["r0"])
        configure(base, DEV_ADMIN_TOKEN, scenario, th, webhook_url=rx.url("/hook"))
        assert ship_to(base, DEV_INGEST_TOKEN, scenario.client_job)
        try:
            result = asyncio.run(run_load(fleet, base, DEV_ADMIN_TOKEN))
        finally:
            assert finish_shipping(30)
        ended = time.time()
        stopped = result.slow_stopped_at or ended

        slow = result.first("slow_replica")
        assert slow is not None, result.incidents
        assert "r2" in slow.summary and "r0" not in slow.summary, slow.summary
        assert slow.evidence.get("replica", "").endswith("r2") or "r2" in json.dumps(slow.evidence)
        assert all("r2" in s.summary for s in result.incidents.values() if s.kind == "slow_replica")
        burn = result.first("slo_burn")
        assert burn is not None, result.incidents
        assert burn.detected_at >= result.started_at - 1
        burns = [s for s in result.incidents.values() if s.kind == "slo_burn"]
        assert any(s.paged for s in burns), [s.evidence for s in burns]
        # Cleared: once the slow replica is out of rotation both incidents resolve, and the
        # webhook hears of it.
        flagged = [s for s in result.incidents.values() if s.kind in ("slow_replica", "slo_burn")]
        assert all(s.resolved_seen_at is not None for s in flagged), (
            [(s.kind, s.id, s.resolved_seen_at) for s in flagged],
            result.burn_after,
        )
        assert not any(t["firing"] for t in result.burn_after), result.burn_after

        kinds = {"slow_replica", "slo_burn"}
        fired = rx.wait(
            lambda reqs: (
                _kinds(reqs, "incident.firing") >= kinds
                and _kinds(reqs, "incident.resolved") >= kinds
            ),
            60,
        )
        assert _kinds(fired, "incident.resolved") >= kinds, [json.loads(r["body"]) for r in fired]
        assert all(r["answered"] == 200 for r in fired)
        assert all("webhook-signature" in r["headers"] for r in fired)  # type: ignore[operator]

        # Vigil's figures for the client's records vs the client's own.
        client = summarize(result.outcomes)
        figures = server_figures(
            base, DEV_ADMIN_TOKEN, scenario.client_job, result.started_at - 60, ended + 60
        )
        server_p50 = figures["chart"]["latency"]["ttft_s"]["p50"][0]
        client_p50 = client.ttft_s[50]
        assert client_p50 is not None and server_p50 is not None
        assert abs(server_p50 - client_p50) <= max(0.05, 0.1 * client_p50), (server_p50, client_p50)
        (slo,) = figures["slos"]
        judged = [o for o in result.outcomes if o.status in ("ok", "error", "rejected")]
        client_attainment = sum(th.met(o) for o in judged) / len(judged)
        assert slo["requests"] == pytest.approx(len(judged), abs=2)
        assert abs(slo["attainment"] - client_attainment) <= 0.02, (slo, client_attainment)
        # And the server's own view (middleware: from arrival at the server), same skew.
        server_side = server_figures(
            base, DEV_ADMIN_TOKEN, scenario.server_job, result.started_at - 60, ended + 60
        )
        mw_p50 = server_side["chart"]["latency"]["ttft_s"]["p50"][0]
        assert abs(mw_p50 - client_p50) <= max(0.05, 0.1 * client_p50), (mw_p50, client_p50)
        print(
            f"\nresolved after r2 stopped (s): "
            f"{[(s.kind, round(s.resolved_seen_at - stopped)) for s in flagged]}; "
            f"burn tiers after: "
            f"{[(t['tier'], t['short_burn_rate'], t['firing']) for t in result.burn_after]}\n"
            f"phases {result.phase1_s:.0f} s + {result.phase2_s:.0f} s; thresholds {th}; "
            f"TTFT p50 client {client_p50 * 1000:.1f} ms, Vigil (client job) "
            f"{server_p50 * 1000:.1f} ms, middleware {mw_p50 * 1000:.1f} ms; attainment client "
            f"{client_attainment:.4f}, Vigil {slo['attainment']:.4f} over {slo['requests']}"
        )


def _kinds(reqs: list[dict[str, Any]], event: str) -> set[str]:
    out = set()
    for r in reqs:
        body = json.loads(r["body"])
        if body.get("type") == event:
            out.add(body["data"]["kind"])
    return out

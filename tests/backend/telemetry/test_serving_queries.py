"""The serving page's numbers against numpy on the same synthetic requests, ingested through
the API: percentiles per time bin, counts and means per replica, since/until, merged bins,
a job without requests, and the row budget (sampled time slices) — on SQLite and Postgres.
Plus the headline that says whether the SLOs are met now."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

from backend.errors import Invalid
from backend.jobs import service as jobs
from backend.telemetry import serving_queries as sq
from backend.telemetry.serving import replica_key
from backend.telemetry.serving_status import slo_headline, window_text
from tests.conftest import ADMIN, INGEST
from tests.factories import batch

JOB = "chat-prod"
T0 = 1_699_999_980.0  # a whole minute
MINUTES = 10


def synthetic_requests(
    *,
    t0: float = T0,
    minutes: int = MINUTES,
    per_minute: int = 60,
    slow: dict[str, float] | None = None,
    replicas: int = 3,
    seed: int = 0,
    model: str | None = "llama",
    prefix: str = "q",
) -> list[dict[str, Any]]:
    """Requests spread over ``minutes`` from ``t0``, round-robin over ``replicas`` replicas
    (``r0``, ``r1``, …); ``slow`` multiplies a replica's TTFT and TPOT. About 3% fail, 2%
    are rejected before a first token; some have one output token (no TPOT)."""
    rng = np.random.default_rng(seed)
    slow = slow or {}
    events = []
    gap = 60.0 / per_minute
    for i in range(minutes * per_minute):
        replica = f"r{i % replicas}"
        factor = slow.get(replica, 1.0)
        arrival = t0 + i * gap + float(rng.uniform(0, gap / 2))
        event: dict[str, Any] = {
            "type": "request",
            "id": f"{prefix}-{i}",
            "arrival": arrival,
            "prompt_tokens": int(rng.integers(10, 500)),
            "replica": replica,
            "status": "ok",
        }
        if model:
            event["model"] = model
        roll = float(rng.random())
        if roll < 0.02:
            event["status"] = "rejected"
        else:
            ttft = float(rng.lognormal(math.log(0.2), 0.4)) * factor
            tpot = float(rng.lognormal(math.log(0.02), 0.3)) * factor
            tokens = 1 if roll < 0.06 else int(rng.integers(2, 120))
            first = arrival + ttft
            event.update(
                first_token=first,
                end=first + tpot * (tokens - 1),
                output_tokens=tokens,
                queue_s=ttft / 4,
                status="error" if roll > 0.97 else "ok",
            )
        events.append(event)
    return events


def ingest_requests(client: Any, events: list[dict[str, Any]], job: str = JOB) -> None:
    for part in range(0, len(events), 500):
        body = batch(events[part : part + 500], job=job, kind="serving", world_size=1)
        reply = client.post("/api/v1/ingest", json=body, headers=INGEST)
        assert reply.status_code == 200, reply.text


def reference(events: list[dict[str, Any]]) -> dict[str, np.ndarray[Any, Any]]:
    """TTFT, TPOT, E2E per request as the definitions say, NaN where undefined."""
    nan = float("nan")

    def get(e: dict[str, Any], key: str) -> float:
        v = e.get(key)
        return nan if v is None else float(v)

    arrival = np.array([e["arrival"] for e in events])
    first = np.array([get(e, "first_token") for e in events])
    end = np.array([get(e, "end") for e in events])
    tokens = np.array([get(e, "output_tokens") for e in events])
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(tokens > 1, (end - first) / (tokens - 1), nan)
    done = np.where(np.isfinite(end), end, np.where(np.isfinite(first), first, arrival))
    return {
        "arrival": arrival,
        "done": done,
        "ttft_s": first - arrival,
        "tpot_s": tpot,
        "e2e_s": end - arrival,
        "replica": np.array([replica_key(e) for e in events]),
        "error": np.array([e["status"] not in ("ok", "aborted_by_client") for e in events]),
        "tokens": np.nan_to_num(tokens),
    }


def expected_percentiles(ref: dict[str, Any], since: float, bin_s: int, count: int) -> Any:
    index = np.floor((ref["arrival"] - since) / bin_s).astype(int)
    out: dict[str, dict[str, list[float | None]]] = {}
    for metric in sq.METRICS:
        out[metric] = {f"p{p}": [] for p in sq.PERCENTILES}
        for i in range(count):
            values = ref[metric][(index == i) & np.isfinite(ref[metric])]
            for p in sq.PERCENTILES:
                out[metric][f"p{p}"].append(
                    float(np.percentile(values, p)) if values.size else None
                )
    return out


def close(got: list[float | None], want: list[float | None]) -> bool:
    assert len(got) == len(want)
    return all(
        (g is None and w is None)
        or (g is not None and w is not None and g == pytest.approx(w, abs=1e-6))
        for g, w in zip(got, want, strict=True)
    )


@pytest.fixture
def events(client: Any) -> list[dict[str, Any]]:
    found = synthetic_requests(slow={"r2": 3.0})
    ingest_requests(client, found)
    return found


@pytest.fixture
def job_id(session: Any, events: list[dict[str, Any]]) -> int:
    found = jobs.get_job_id(session=session, name=JOB)
    assert found is not None
    return found


def chart(session: Any, job_id: int, **kw: Any) -> dict[str, Any]:
    return sq.serving_chart(session=session, job_id=job_id, job=JOB, **kw)


def test_percentiles_per_bin_equal_numpy(session, job_id, events):
    out = chart(session, job_id, since=T0, until=T0 + MINUTES * 60, max_points=MINUTES)
    assert (out["since"], out["until"], out["bin_s"]) == (T0, T0 + 600, 60)
    assert out["t"] == [T0 + 60 * i for i in range(MINUTES)]
    assert not out["sampled"] and out["requests_read"] == len(events)
    want = expected_percentiles(reference(events), T0, 60, MINUTES)
    for metric in sq.METRICS:
        for p in ("p50", "p90", "p99"):
            assert close(out["latency"][metric][p], want[metric][p]), (metric, p)
    assert sum(out["latency_requests"]) == len(events)


def test_counts_and_means_per_bin_and_replica_equal_numpy(session, job_id, events):
    # Until a minute after the last arrival: every request has ended by then.
    out = chart(session, job_id, since=T0, until=T0 + (MINUTES + 1) * 60, max_points=100)
    ref = reference(events)
    minute = np.floor((ref["done"] - T0) / 60).astype(int)
    assert out["requests"] == [int((minute == i).sum()) for i in range(MINUTES + 1)]
    assert out["errors"] == [int(((minute == i) & ref["error"]).sum()) for i in range(MINUTES + 1)]
    tokens = [float(ref["tokens"][minute == i].sum()) / 60 for i in range(MINUTES + 1)]
    assert out["output_tokens_per_s"] == pytest.approx(tokens, abs=1e-3)
    by_name = {r["replica"]: r for r in out["replicas"]}
    assert sorted(by_name) == ["llama/r0", "llama/r1", "llama/r2"]
    assert out["replicas_total"] == 3 and len(out["replica_series"]) == 3
    for name, row in by_name.items():
        mine = ref["replica"] == name
        ttft, tpot = ref["ttft_s"][mine], ref["tpot_s"][mine]
        assert row["requests"] == int(mine.sum())
        assert row["errors"] == int((mine & ref["error"]).sum())
        assert row["ttft_mean_s"] == pytest.approx(np.nanmean(ttft), abs=2e-6)
        assert row["tpot_mean_s"] == pytest.approx(np.nanmean(tpot), abs=2e-6)
        assert row["ttft_p90_s"] == pytest.approx(np.nanpercentile(ttft, 90), abs=2e-6)
    # The slow replica stands out: three times the others' mean TTFT, give or take.
    slow, fast = by_name["llama/r2"], by_name["llama/r0"]
    assert slow["ttft_mean_s"] > 2.5 * fast["ttft_mean_s"]
    assert slow["tpot_mean_s"] > 2.5 * fast["tpot_mean_s"]
    series = {s["replica"]: s for s in out["replica_series"]}
    assert sum(series["llama/r2"]["requests"]) == slow["requests"]


def test_since_until_and_merged_bins(session, job_id, events):
    since, until = T0 + 120, T0 + 420  # minutes 2…6
    out = chart(session, job_id, since=since, until=until, max_points=2)
    assert (out["since"], out["until"], out["bin_s"]) == (since, until, 180)
    assert out["t"] == [since, since + 180]
    ref = reference(events)
    inside = (ref["arrival"] >= since) & (ref["arrival"] < until)
    assert out["requests_read"] == int(inside.sum())
    part = {k: v[inside] for k, v in ref.items()}
    want = expected_percentiles(part, since, 180, 2)
    for metric in sq.METRICS:
        assert close(out["latency"][metric]["p90"], want[metric]["p90"]), metric
    done = (ref["done"] >= since) & (ref["done"] < until)
    assert sum(out["requests"]) == int(done.sum())
    assert sum(r["requests"] for r in out["replicas"]) == int(done.sum())
    # A range not on whole minutes is widened to them.
    widened = chart(session, job_id, since=since + 10, until=until - 10, max_points=10)
    assert (widened["since"], widened["until"]) == (since, until)


def test_default_range_is_the_hour_up_to_the_last_request(session, job_id, events):
    out = chart(session, job_id)
    last = max(e["arrival"] for e in events)
    assert out["until"] == (math.floor(last / 60) + 1) * 60
    assert out["since"] == out["until"] - sq.DEFAULT_RANGE_S
    assert out["requests_read"] == len(events)
    with pytest.raises(Invalid):
        chart(session, job_id, since=T0 + 60, until=T0)


def test_a_job_without_requests(client, session):
    body = batch([{"type": "metric", "name": "x", "value": 1.0}], job="idle", kind="serving")
    assert client.post("/api/v1/ingest", json=body, headers=INGEST).status_code == 200
    job_id = jobs.get_job_id(session=session, name="idle")
    out = sq.serving_chart(session=session, job_id=job_id, job="idle", now=T0, max_points=60)
    assert (out["since"], out["until"]) == (T0 - 3600, T0)
    assert len(out["t"]) == 60 and out["requests"] == [0] * 60
    assert out["latency"]["ttft_s"]["p50"] == [None] * 60
    assert out["replicas"] == [] and out["replica_series"] == [] and out["slos"] == []
    assert out["requests_read"] == 0 and not out["sampled"]


def test_over_the_row_budget_bins_are_sampled_in_time_slices(session, job_id, events, monkeypatch):
    full = chart(session, job_id, since=T0, until=T0 + 600, max_points=5)
    monkeypatch.setattr(sq, "ROW_BUDGET", 300)
    out = chart(session, job_id, since=T0, until=T0 + 600, max_points=5)
    assert out["sampled"] and 150 <= out["requests_read"] <= 300
    assert all(n > 20 for n in out["latency_requests"])
    # Counts and means come from the minutes, whole; the percentiles are close.
    assert out["requests"] == full["requests"]
    for got, want in zip(
        out["latency"]["ttft_s"]["p50"], full["latency"]["ttft_s"]["p50"], strict=True
    ):
        assert got == pytest.approx(want, rel=0.35)


def test_read_plan_stays_within_the_budget_and_the_slice_limit():
    assert sq.read_plan(sq.MinuteBins.plan(T0, T0 + 600, 10), [10] * 10) is None
    few = sq.MinuteBins.plan(T0, T0 + 3600, 60)
    sliced = sq.read_plan(few, [10_000] * 60)
    per_bin = min(sq.SLICES_PER_BIN, sq.MAX_SLICES // 60)
    assert sliced is not None and len(sliced) == 60 * per_bin <= sq.MAX_SLICES
    bins = sq.MinuteBins.plan(T0, T0 + 400 * 60, 400)
    heavy = [10_000 if i % 2 else 5 for i in range(bins.count)]
    ranges = sq.read_plan(bins, heavy)
    assert ranges is not None and len(ranges) <= max(sq.MAX_SLICES, bins.count)
    assert all(a < b for a, b in ranges)
    assert all(b1 <= a2 for (_, b1), (a2, _) in itertools.pairwise(ranges))

    # Expected rows read, if arrivals are even within each bin: at most the budget.
    def overlap(i: int) -> float:
        lo, hi = bins.start(i), bins.start(i) + 60
        return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in ranges) / 60

    read = sum(n * overlap(i) for i, n in enumerate(heavy))
    assert read <= sq.ROW_BUDGET * 1.01


def test_routes_answer_in_shape_and_refuse_bad_ranges(client, events):
    reply = client.get(
        f"/api/v1/jobs/{JOB}/serving",
        params={"since": T0, "until": T0 + 600, "max_points": 5},
        headers=ADMIN,
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["bin_s"] == 120 and len(body["latency"]["e2e_s"]["p99"]) == 5
    assert client.get("/api/v1/jobs/nope/serving", headers=ADMIN).status_code == 404
    bad = client.get(
        f"/api/v1/jobs/{JOB}/serving", params={"since": T0, "until": T0}, headers=ADMIN
    )
    assert bad.status_code == 422
    too_many = client.get(f"/api/v1/jobs/{JOB}/serving?max_points=100000", headers=ADMIN)
    assert too_many.status_code == 422
    status = client.get(f"/api/v1/jobs/{JOB}/serving/status", headers=ADMIN).json()
    assert status["headline"]["level"] == "none" and status["slos"] == []
    schema = client.get("/openapi.json").json()
    assert "ServingChart" in schema["components"]["schemas"]
    assert "/api/v1/jobs/{job}/serving/status" in schema["paths"]


def test_slo_series_per_bin(client, session):
    body = {"job": JOB, "name": "interactive", "ttft_s": 0.5, "objective": 0.9}
    assert client.post("/api/v1/slos", json=body, headers=ADMIN).status_code == 201
    events = synthetic_requests(slow={"r2": 3.0})  # old: judged at ingest, not on creation
    ingest_requests(client, events)
    job_id = jobs.get_job_id(session=session, name=JOB)
    out = chart(session, job_id, since=T0, until=T0 + 660, max_points=11)
    [slo] = out["slos"]
    assert slo["name"] == "interactive" and slo["objective"] == 0.9
    ref = reference(events)
    ended = np.isfinite(ref["e2e_s"])  # unfinished requests are not judged
    minute = np.floor((ref["done"] - T0) / 60).astype(int)
    assert slo["requests"] == [int(((minute == i) & ended).sum()) for i in range(11)]
    # The slow replica misses 0.5 s often, the others rarely: attainment well below 1.
    assert all(a is not None and 0.4 < a < 0.95 for a in slo["attainment"][:-1])
    good = [(a or 0) * n / 60 for a, n in zip(slo["attainment"], slo["requests"], strict=True)]
    assert slo["goodput_rps"] == pytest.approx(good, abs=1e-5)


def rate(tier: str, factor: float, burn: float, firing: bool) -> dict[str, Any]:
    windows = {14.4: (3600, 300), 6.0: (21600, 1800), 1.0: (259200, 21600)}[factor]
    return {
        "tier": tier,
        "severity": "critical" if tier.startswith("page") else "warning",
        "long_window_s": windows[0],
        "short_window_s": windows[1],
        "factor": factor,
        "long_burn_rate": burn,
        "short_burn_rate": burn,
        "firing": firing,
    }


def status(name: str, attainment: float | None, *rates: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "objective": 0.99,
        "attainment": attainment,
        "burn_rates": list(rates),
        "error": None,
    }


def test_headline_says_whether_the_slos_are_met_now():
    assert slo_headline([])["level"] == "none"
    calm = [rate("page-fast", 14.4, 0.5, False), rate("ticket", 1.0, 0.5, False)]
    ok = slo_headline([status("a", 0.995, *calm), status("b", 0.9995, *calm)])
    assert ok["level"] == "ok" and ok["text"].startswith("All 2 SLOs met now")
    assert ok["worst"] == {"name": "a", "attainment": 0.995, "objective": 0.99}
    fast = rate("page-fast", 14.4, 20.0, True)
    burning = slo_headline([status("a", 0.8, fast), status("b", 1.0)])
    assert burning["level"] == "critical" and burning["short"] == "SLO violated"
    assert "a (burning its error budget 20.0× over 1h/5m; page-fast at 14.4×)" in burning["text"]
    ticket = slo_headline([status("a", 0.985, rate("ticket", 1.0, 1.5, True))])
    assert ticket["level"] == "warning" and ticket["text"].startswith("SLO at risk")
    below = slo_headline([status("a", 0.985, *calm)])
    assert below["level"] == "warning" and "98.5% vs objective 99%" in below["text"]
    broken = {**status("a", None), "error": "status unavailable (ImportError)"}
    assert slo_headline([broken])["level"] == "unknown"
    assert slo_headline([status("a", None)])["level"] == "none"
    assert window_text(259200, 21600) == "3d/6h"
    assert window_text(241920, 20160) == "2d19h12m/5h36m"

"""Multiwindow, multi-burn-rate SLO alerts: windows, burn rates against a slicing reference,
the tiers' severities, recovery, idle minutes, and the registered detector."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from detectors.burn_rate import (
    BASE_TIERS,
    burn_rates,
    evaluate,
    window_sums,
    windows_for,
)
from detectors.registry import run
from detectors.window import ServingWindow, SloSeries, Window

DAY = 86400.0
M = 4320  # three days of minutes
T0 = 28_000_000  # an epoch minute


def _slo(total: Any, good: Any, objective: float = 0.999, **kw: Any) -> SloSeries:
    return SloSeries(
        slo_id=kw.pop("slo_id", 1),
        name=kw.pop("name", "chat"),
        objective=objective,
        period_s=kw.pop("period_s", 30 * DAY),
        total=np.asarray(total, dtype=float),
        good=np.asarray(good, dtype=float),
        **kw,
    )


def _serving(slos: list[SloSeries], m: int = M) -> ServingWindow:
    empty = np.zeros((0, m))
    return ServingWindow(
        now=(T0 + m - 1) * 60.0 + 30.0,
        minutes=np.arange(T0, T0 + m, dtype=np.int64),
        slos=slos,
        replicas=(),
        requests=empty,
        errors=empty,
        ttft_sum=empty,
        ttft_n=empty,
        tpot_sum=empty,
        tpot_n=empty,
        queue_sum=empty,
        queue_n=empty,
        arrivals=empty,
    )


def _traffic(error_rate: np.ndarray[Any, Any], per_minute: float = 1000.0) -> tuple[Any, Any]:
    total = np.full(error_rate.size, per_minute)
    return total, total * (1.0 - error_rate)


def test_windows_for_30_and_28_days() -> None:
    assert windows_for(30 * DAY) == BASE_TIERS
    got = [(t.name, t.long_minutes, t.short_minutes, t.factor) for t in windows_for(28 * DAY)]
    assert got == [
        ("page-fast", 56, 5, 14.4),
        ("page-slow", 336, 28, 6.0),
        ("ticket", 4032, 336, 1.0),
    ]
    for period in (7 * DAY, 28 * DAY, 30 * DAY, 90 * DAY):
        share = [t.factor * t.long_s / period for t in windows_for(period)]
        assert share == pytest.approx([0.02, 0.05, 0.10], rel=0.02)  # the budget each spends
    assert windows_for(3600.0)[0].short_minutes == 1  # never below one minute
    with pytest.raises(ValueError):
        windows_for(0.0)


def test_window_sums_match_a_loop() -> None:
    rng = np.random.default_rng(0)
    x = rng.poisson(3.0, 500).astype(float)
    for width in (1, 5, 60, 499, 500, 2000):
        ref = [x[max(0, j - width + 1) : j + 1].sum() for j in range(x.size)]
        np.testing.assert_allclose(window_sums(x, width), ref)


@pytest.mark.parametrize("seed", range(3))
def test_burn_rates_match_a_slicing_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    total = rng.poisson(50, M).astype(float)
    total[rng.random(M) < 0.1] = 0.0  # idle minutes
    good = total - rng.binomial(total.astype(int), rng.uniform(0, 0.05))
    objective = 0.99
    tiers = windows_for(28 * DAY)
    got = burn_rates(total, good, objective, tiers)
    for tier, row in zip(tiers, got, strict=True):
        for which, width in (("long", tier.long_minutes), ("short", tier.short_minutes)):
            t, g = total[-width:].sum(), good[-width:].sum()
            ref = (1 - g / t) / (1 - objective) if t else None
            assert row[f"{which}_total"] == t
            if ref is None:
                assert row[f"{which}_burn_rate"] is None
            else:
                assert row[f"{which}_burn_rate"] == pytest.approx(ref, rel=1e-3)
        firing = (row["long_burn_rate"] or 0) > tier.factor and (
            row["short_burn_rate"] or 0
        ) > tier.factor
        assert row["firing"] == firing
    assert [r["long_burn_rate"] for r in burn_rates([], [], 0.99, tiers)] == [None] * 3


def test_a_fast_burn_pages() -> None:
    rate = np.zeros(M)
    rate[-60:] = 0.02  # 2% errors for an hour against a 99.9% objective: 20x
    f = evaluate(_slo(*_traffic(rate)), np.arange(T0, T0 + M))
    assert f is not None and f.active
    assert (f.kind, f.key, f.severity, f.ranks) == ("slo_burn", "slo_burn:1", "critical", ())
    assert f.evidence["tier"] == "page-fast" and f.evidence["burn_rate"] == pytest.approx(20.0)
    firing = {t["tier"]: t["firing"] for t in f.evidence["tiers"]}
    assert firing == {"page-fast": True, "page-slow": False, "ticket": False}
    # Firing starts once the hour's burn passes 14.4x: 44 of the 60 minutes in.
    assert f.first_step == T0 + M - 60 + 43 and f.last_step == T0 + M - 1


def test_a_slow_burn_opens_a_ticket_and_a_spike_on_top_pages_under_the_same_key() -> None:
    rate = np.full(M, 0.002)  # 2x for three days
    f = evaluate(_slo(*_traffic(rate)), np.arange(T0, T0 + M))
    assert f is not None and (f.severity, f.evidence["tier"], f.active) == (
        "warning",
        "ticket",
        True,
    )
    rate[-70:] = 0.05  # then 50x for 70 minutes
    g = evaluate(_slo(*_traffic(rate)), np.arange(T0, T0 + M))
    assert g is not None and (g.severity, g.key) == ("critical", f.key)
    assert g.first_step == f.first_step  # the same episode: the ticket tier never stopped


def test_the_alert_resolves_when_the_short_window_recovers() -> None:
    rate = np.zeros(M)
    rate[-70:-6] = 0.02  # 64 minutes at 20x, then 6 clean minutes
    f = evaluate(_slo(*_traffic(rate)), np.arange(T0, T0 + M))
    assert f is not None and not f.active
    page_fast = f.evidence["tiers"][0]
    assert page_fast["long_burn_rate"] > 14.4 > page_fast["short_burn_rate"]
    assert f.last_step == T0 + M - 7 + 1  # the last minute with 4 bad ones in the last 5
    assert [t["tier"] for t in f.evidence["fired_tiers"]] == ["page-fast"]
    assert "recovered" in f.summary
    rate[-70:] = 0.0
    assert evaluate(_slo(*_traffic(rate)), np.arange(T0, T0 + M)) is None


def test_a_nearly_empty_current_minute_does_not_resolve_the_alert() -> None:
    """With one-minute windows (a one-hour period) the current minute decides alone; a
    minute that has only just begun (one good request) must not flap the alert."""
    m = 120
    total, good = np.full(m, 60.0), np.full(m, 60.0)
    good[-30:-1] = 30.0  # half bad for 29 minutes: far past 14.4x of a 99.9% objective
    total[-1], good[-1] = 1.0, 1.0  # the current minute: one good request so far
    f = evaluate(_slo(total, good, period_s=3600.0), np.arange(T0, T0 + m))
    assert f is not None and f.active and f.severity == "critical"
    # A whole clean minute later the alert does resolve.
    total2, good2 = np.append(total, 60.0), np.append(good, 60.0)
    total2[-2], good2[-2] = 60.0, 60.0
    f = evaluate(_slo(total2, good2, period_s=3600.0), np.arange(T0, T0 + m + 1))
    assert f is not None and not f.active


def test_windows_without_requests_never_fire() -> None:
    total = np.zeros(M)
    total[-20] = 10.0  # ten failed requests 20 minutes ago, nothing since
    rows = burn_rates(total, np.zeros(M), 0.999, windows_for(30 * DAY))
    # The hour burns 1000x, but its 5-minute window is empty: undefined, so not firing.
    assert rows[0]["long_burn_rate"] == 1000.0 and rows[0]["short_burn_rate"] is None
    assert not rows[0]["firing"]
    assert rows[1]["firing"]  # the 30-minute window does hold them: every one failed
    f = evaluate(_slo(total, np.zeros(M)), np.arange(T0, T0 + M))
    assert f is not None and f.evidence["tier"] == "page-slow"
    assert evaluate(_slo(np.zeros(M), np.zeros(M)), np.arange(T0, T0 + M)) is None
    assert evaluate(_slo([], []), []) is None


def test_error_budget_left_over_the_period_or_the_window() -> None:
    rate = np.zeros(M)
    rate[-60:] = 0.02
    total, good = _traffic(rate)
    f = evaluate(_slo(total, good), np.arange(T0, T0 + M))
    assert f is not None and f.evidence["budget_scope"] == "window"
    spent = (60 * 1000 * 0.02 / total.sum()) / 0.001
    assert f.evidence["error_budget_remaining"] == pytest.approx(1 - spent, abs=1e-4)
    g = evaluate(_slo(total, good, period_total=1e7, period_good=1e7 - 2e4), np.arange(T0, T0 + M))
    assert g is not None and g.evidence["budget_scope"] == "period"
    assert g.evidence["error_budget_remaining"] == 0.0  # 2e-3 bad against 1e-3: overspent
    assert g.evidence["error_budget_consumed"] == pytest.approx(2.0)


def test_the_registered_detector_reports_each_burning_slo() -> None:
    rate = np.zeros(M)
    rate[-60:] = 0.02
    burning = _slo(*_traffic(rate), slo_id=3, name="interactive")
    calm = _slo(*_traffic(np.zeros(M)), slo_id=4, name="batch")
    result = run(Window(serving=_serving([burning, calm])))
    assert result.failures == []
    assert {"burn_rate", "slow_replica", "queue_buildup"} <= set(result.ran)
    assert [f.key for f in result.findings if f.kind == "slo_burn"] == ["slo_burn:3"]
    assert "slo_burn" in result.covered


def test_evaluation_at_a_million_requests_agrees_with_the_tier_table() -> None:
    """Three days of minutes holding ~1 M requests, five SLOs: the registered detector runs
    cleanly and fires exactly for the SLOs whose tier table says one fires now. (How fast:
    ``bench/burn_rate.py``; timing goals are not unit tests.)"""
    rng = np.random.default_rng(0)
    slos = []
    for i in range(5):
        total = rng.poisson(230, M).astype(float)  # ~1 M requests over three days
        good = total - rng.binomial(total.astype(int), 0.002 + 0.004 * i)
        slos.append(_slo(total, good, objective=0.99 + 0.002 * i, slo_id=i))
    window = Window(serving=_serving(slos))
    result = run(window)
    assert result.failures == [] and "slo_burn" in result.covered
    fired = {f.key for f in result.findings if f.active}
    minutes = np.arange(T0, T0 + M)
    for slo in slos:
        tiers = burn_rates(slo.total, slo.good, slo.objective, windows_for(slo.period_s))
        firing_now = any(t["firing"] for t in tiers)
        assert (f"slo_burn:{slo.slo_id}" in fired) == firing_now
        assert (evaluate(slo, minutes) is not None) >= firing_now

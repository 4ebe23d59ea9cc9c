"""detectors.serving against a plain per-request reference, on random requests."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from detectors.serving import (
    ABORTED,
    ERROR,
    OK,
    REJECTED,
    attainment,
    goodput,
    judged,
    meets,
    percentiles,
    request_metrics,
    status_codes,
)

NAN = float("nan")


def _random_requests(rng: np.random.Generator, count: int) -> list[dict[str, Any]]:
    out = []
    for _ in range(count):
        arrival = float(rng.uniform(0, 600))
        status = str(rng.choice(["ok"] * 6 + ["error", "rejected", "aborted_by_client", "odd"]))
        if status == "rejected" or rng.random() < 0.05:
            out.append(
                {
                    "arrival": arrival,
                    "first_token": None,
                    "end": arrival + float(rng.uniform(0, 3)),
                    "output_tokens": 0,
                    "status": status,
                    "max_tbt_s": None,
                    "times": None,
                }
            )
            continue
        n = int(rng.integers(1, 40))
        first = arrival + float(rng.exponential(0.5))
        times = first + np.concatenate(([0.0], np.cumsum(rng.exponential(0.05, n - 1))))
        with_times = rng.random() < 0.5
        out.append(
            {
                "arrival": arrival,
                "first_token": first,
                "end": float(times[-1]),
                "output_tokens": n if rng.random() < 0.95 else None,
                "status": status,
                "max_tbt_s": float(np.max(np.diff(times)))
                if n >= 2 and rng.random() < 0.8
                else None,
                "times": times.tolist() if with_times else None,
            }
        )
    return out


def _ref(r: dict[str, Any]) -> dict[str, float]:
    """The definitions, one request at a time."""
    first, end, n = r["first_token"], r["end"], r["output_tokens"]
    ttft = first - r["arrival"] if first is not None else NAN
    e2e = end - r["arrival"] if end is not None else NAN
    tpot = (end - first) / (n - 1) if n is not None and n >= 2 and first is not None else NAN
    if n is not None and n <= 1:
        max_tbt = NAN
    elif r["times"] is not None and len(r["times"]) >= 2:
        max_tbt = max(b - a for a, b in zip(r["times"], r["times"][1:], strict=False))
    else:
        max_tbt = r["max_tbt_s"] if r["max_tbt_s"] is not None else NAN
    return {"ttft": ttft, "tpot": tpot, "e2e": e2e, "max_tbt": max_tbt}


def _ref_met(r: dict[str, Any], name: str, limit: float) -> bool:
    v = _ref(r)
    if name == "ttft_s":
        return v["ttft"] <= limit
    if name == "e2e_s":
        return v["e2e"] <= limit
    if name == "tpot_s":
        return math.isnan(v["tpot"]) or v["tpot"] <= limit
    gap = v["tpot"] if math.isnan(v["max_tbt"]) else v["max_tbt"]
    return math.isnan(gap) or gap <= limit


def _ref_missed_before_abort(r: dict[str, Any], limits: dict[str, float]) -> bool:
    for name, limit in limits.items():
        if name == "ttft_s":
            waited = (r["first_token"] if r["first_token"] is not None else r["end"]) - r["arrival"]
            if waited > limit:
                return True
        elif name == "e2e_s":
            if r["end"] - r["arrival"] > limit:
                return True
        elif not _ref_met(r, name, limit):
            return True
    return False


def _metrics(reqs: list[dict[str, Any]]) -> Any:
    return request_metrics(
        arrival=[r["arrival"] for r in reqs],
        first_token=[r["first_token"] for r in reqs],
        end=[r["end"] for r in reqs],
        output_tokens=[r["output_tokens"] for r in reqs],
        max_tbt_s=[r["max_tbt_s"] for r in reqs],
        status=[r["status"] for r in reqs],
        token_times=[r["times"] for r in reqs],
    )


LIMITS = [
    {"ttft_s": 0.5},
    {"tpot_s": 0.06},
    {"max_tbt_s": 0.2},
    {"e2e_s": 2.0},
    {"ttft_s": 0.8, "tpot_s": 0.07, "max_tbt_s": 0.3, "e2e_s": 3.0},
]


@pytest.mark.parametrize("seed", range(5))
def test_metrics_match_the_reference(seed: int) -> None:
    reqs = _random_requests(np.random.default_rng(seed), 400)
    m = _metrics(reqs)
    for i, r in enumerate(reqs):
        ref = _ref(r)
        for name in ("ttft", "tpot", "e2e", "max_tbt"):
            got = float(getattr(m, name)[i])
            assert (math.isnan(got) and math.isnan(ref[name])) or got == pytest.approx(ref[name])


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("limits", LIMITS, ids=lambda d: "+".join(d))
def test_meets_judged_and_attainment_match_the_reference(
    seed: int, limits: dict[str, float]
) -> None:
    reqs = _random_requests(np.random.default_rng(100 + seed), 400)
    m = _metrics(reqs)
    joint, per = meets(m, **limits)
    counted = judged(m, **limits)
    assert sorted(per) == sorted(limits)
    good = total = 0
    for i, r in enumerate(reqs):
        ok = r["status"] == "ok"
        ref_per = {name: ok and _ref_met(r, name, v) for name, v in limits.items()}
        for name in limits:
            assert bool(per[name][i]) == ref_per[name], (i, name, r)
        assert bool(joint[i]) == all(ref_per.values())
        ref_counted = r["status"] != "aborted_by_client" or _ref_missed_before_abort(r, limits)
        assert bool(counted[i]) == ref_counted, (i, r)
        total += ref_counted
        good += ref_counted and all(ref_per.values())
    assert attainment(m, **limits) == pytest.approx(good / total)


def test_status_codes() -> None:
    assert status_codes(["ok", "error", "aborted_by_client", "rejected"]).tolist() == [
        OK,
        ERROR,
        ABORTED,
        REJECTED,
    ]
    assert status_codes("timeout").tolist() == [ERROR]
    assert status_codes(None, 3).tolist() == [OK, OK, OK]
    assert status_codes([None, 7, True]).tolist() == [OK, ERROR, ERROR]


def test_one_token_meets_tpot_and_max_tbt_and_errors_miss_everything() -> None:
    m = request_metrics(
        arrival=[0.0, 0.0, 0.0],
        first_token=[0.1, 0.1, 0.1],
        end=[0.1, 0.1, 0.2],
        output_tokens=[1, 1, 2],
        status=["ok", "error", "ok"],
    )
    joint, per = meets(m, tpot_s=0.01, max_tbt_s=0.01)
    assert per["tpot_s"].tolist() == [True, False, False]  # 2 tokens 0.1 s apart: TPOT 0.1
    assert per["max_tbt_s"].tolist() == [True, False, False]  # unknown max TBT >= TPOT
    assert joint.tolist() == [True, False, False]


def test_a_single_request_at_ingest() -> None:
    m = request_metrics(arrival=10.0, first_token=10.3, end=12.3, output_tokens=21, status="ok")
    joint, _ = meets(m, ttft_s=0.5, tpot_s=0.1)
    assert len(m) == 1 and bool(joint[0]) and float(m.tpot[0]) == pytest.approx(0.1)


def test_aborted_by_client_counts_only_after_a_miss() -> None:
    m = request_metrics(
        arrival=[0.0, 0.0, 0.0, 0.0],
        first_token=[0.2, None, 0.2, 0.2],
        end=[0.5, 3.0, 9.0, 0.9],
        output_tokens=[4, 0, 50, 3],
        status=["aborted_by_client"] * 4,
    )
    limits = {"ttft_s": 1.0, "e2e_s": 5.0}
    # left early and happy; waited 3 s for a first token; ran past the E2E target; happy
    assert judged(m, **limits).tolist() == [False, True, True, False]
    assert meets(m, **limits)[0].tolist() == [False] * 4
    assert attainment(m, **limits) == 0.0
    assert attainment(m, ttft_s=10.0) is None  # nobody judged


def test_goodput_counts_good_requests_that_ended_in_the_range() -> None:
    m = request_metrics(
        arrival=[0.0, 10.0, 20.0, 50.0],
        first_token=[0.1, 10.1, 21.0, 50.1],
        end=[5.0, 15.0, 25.0, 70.0],
        output_tokens=[100, 200, 300, 400],
    )
    joint, _ = meets(m, ttft_s=0.5)
    g = goodput(m, joint, since=0.0, until=60.0)
    assert (g.good, g.seconds) == (2, 60.0)  # the third is late, the fourth ends after
    assert g.requests_per_s == pytest.approx(2 / 60)
    assert g.tokens_per_s == pytest.approx(300 / 60)
    with pytest.raises(ValueError):
        goodput(m, joint, since=1.0, until=1.0)


def test_percentiles_over_ok_requests() -> None:
    rng = np.random.default_rng(3)
    reqs = _random_requests(rng, 500)
    m = _metrics(reqs)
    got = percentiles(m, q=(50, 99))
    ttft = [_ref(r)["ttft"] for r in reqs if r["status"] == "ok"]
    ttft = [v for v in ttft if not math.isnan(v)]
    assert got["ttft"]["p50"] == pytest.approx(float(np.percentile(ttft, 50)))
    assert got["ttft"]["p99"] == pytest.approx(float(np.percentile(ttft, 99)))
    assert set(got) == {"ttft", "tpot", "e2e", "max_tbt"}

"""Burn-rate evaluation cost: 1,000,000 requests over three days, judged against a few SLOs,
rolled up into 4,320 minutes, then every multiwindow burn-rate tier evaluated, one core.

From the repository root::

    .venv/bin/python bench/burn_rate.py                 # 1 M requests, 4 SLOs, median of 7
    .venv/bin/python bench/burn_rate.py --requests 200000 --slos 8 --repeat 11

The requests are synthetic: arrivals spread over 4,320 minutes with a daily cycle, TTFT
lognormal, 1-400 output tokens at a lognormal TPOT, 0.5% errors, and a two-hour incident
that ends half an hour before the window does, in which TTFT triples (so the detector also
builds findings: active for the SLOs whose slow tiers still burn, recovered for the rest).
Timed, each as the median of ``--repeat`` runs after one warm-up:

- **judge**: ``request_metrics`` and ``meets`` over the 1 M requests, per SLO (what ingest
  does batch by batch, here in one go);
- **roll up**: per-minute ``total``/``good`` counts per SLO (``np.bincount``), what the
  backend's ``slo_minutes`` table holds;
- **evaluate**: the ``burn_rate`` detector on the window of per-minute counts (every tier,
  every minute, every SLO) — the figure held against the < 500 ms target.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # must precede the first import of numpy

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.append(str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from detectors.burn_rate import _detect as burn_rate_detector  # noqa: E402
from detectors.serving import meets, request_metrics  # noqa: E402
from detectors.window import ServingWindow, SloSeries, Window  # noqa: E402

MINUTES = 4320
T0_MINUTE = 28_000_000
SLOS = [
    {"ttft_s": 0.5, "tpot_s": 0.05},
    {"ttft_s": 1.0},
    {"e2e_s": 20.0},
    {"ttft_s": 0.4, "max_tbt_s": 0.2},
    {"tpot_s": 0.045},
    {"ttft_s": 2.0, "e2e_s": 25.0},
    {"max_tbt_s": 0.5},
    {"ttft_s": 0.8, "tpot_s": 0.06, "e2e_s": 25.0},
]


def synthetic_requests(n: int, seed: int = 0) -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    minute = np.sort(rng.choice(MINUTES, size=n, p=_daily_cycle()))
    arrival = (T0_MINUTE + minute) * 60.0 + rng.uniform(0, 60, n)
    incident = minute >= MINUTES - 150
    ttft = rng.lognormal(np.log(0.15), 0.35, n) * np.where(incident & (minute < MINUTES - 30), 3, 1)
    tokens = np.clip(rng.lognormal(np.log(120), 0.8, n), 1, 400).round()
    tpot = rng.lognormal(np.log(0.03), 0.15, n)
    first = arrival + ttft
    end = first + tpot * (tokens - 1)
    status = np.where(rng.random(n) < 0.005, "error", "ok")
    max_tbt = tpot * rng.uniform(1.5, 4.0, n)
    return {
        "arrival": arrival,
        "first_token": first,
        "end": end,
        "output_tokens": tokens,
        "status": status,
        "max_tbt_s": max_tbt,
    }


def _daily_cycle() -> np.ndarray[Any, Any]:
    m = np.arange(MINUTES)
    w = 1.0 + 0.6 * np.sin(2 * np.pi * m / 1440.0)
    return np.asarray(w / w.sum())


def _median_time(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    out = fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)), out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--slos", type=int, default=4, choices=range(1, len(SLOS) + 1))
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)

    reqs = synthetic_requests(args.requests)
    slos = SLOS[: args.slos]

    def judge() -> list[np.ndarray[Any, Any]]:
        m = request_metrics(**reqs)
        return [meets(m, **limits)[0] for limits in slos]

    t_judge, good_masks = _median_time(judge, args.repeat)
    minute_idx = (reqs["end"] // 60).astype(np.int64) - T0_MINUTE
    minute_idx = np.clip(minute_idx, 0, MINUTES - 1)

    def roll_up() -> list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
        total = np.bincount(minute_idx, minlength=MINUTES).astype(float)
        return [(total, np.bincount(minute_idx, weights=g, minlength=MINUTES)) for g in good_masks]

    t_roll, counts = _median_time(roll_up, args.repeat)
    series = [
        SloSeries(
            slo_id=i,
            name=f"slo-{i}",
            objective=0.99,
            period_s=30 * 86400.0,
            total=total,
            good=good,
        )
        for i, (total, good) in enumerate(counts)
    ]
    empty = np.zeros((0, MINUTES))
    window = Window(
        serving=ServingWindow(
            now=(T0_MINUTE + MINUTES) * 60.0 - 1.0,
            minutes=np.arange(T0_MINUTE, T0_MINUTE + MINUTES, dtype=np.int64),
            slos=series,
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
    )
    t_eval, findings = _median_time(lambda: burn_rate_detector(window), args.repeat)

    print(f"requests            {args.requests:,} over {MINUTES:,} minutes, {len(slos)} SLOs")
    print(f"judge (metrics+meets, all SLOs)   {1000 * t_judge:8.1f} ms")
    print(f"roll up into minute counts        {1000 * t_roll:8.1f} ms")
    print(f"evaluate burn rates (detector)    {1000 * t_eval:8.2f} ms   (target < 500 ms)")
    for f in findings:
        print(f"  {f.key:<12} {f.severity:<8} active={f.active}  {f.summary}")


if __name__ == "__main__":
    main()

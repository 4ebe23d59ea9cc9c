"""What ``GET /metrics`` says about the jobs, for Prometheus and Grafana (Vigil's own
process metrics are in ``backend.metrics``).

Serving histograms are observed at ingest, with vLLM's semantics and bucket edges under
``vigil_`` names, labelled by job, model and replica (per process: Prometheus sums the API
replicas it scrapes, as it does for any counter). Gauges are read from the database at
scrape time: per SLO its attainment, goodput, smooth goodput, error budget left and burn
rates; per training job its step time, open incidents by kind and severity, goodput, and
the straggler score of each rank an open straggler incident names. Cardinality is bounded:
no per-request labels, at most ``MAX_SERIES`` label sets per histogram (the rest are
counted under ``replica="other"``), ranks only when an incident names them.

The per-job gauges carry ``run``: the number of the launch of the job name they describe
(``backend.jobs.runs``; ``1`` for a job without runs). Step time, goodput and heartbeat
age are of the job's current run alone (a relaunch starts its own series); an incident's
run is the one it was opened in. One series per job at a time, so the label adds none.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session, sessionmaker

from backend.db import utcnow
from backend.goodput.service import job_goodput
from backend.incidents.models import Incident
from backend.incidents.service import run_of
from backend.jobs.models import Job, Rank, Run
from backend.metrics import REGISTRY
from backend.slos import service as slos
from backend.telemetry.binning import RunRows
from backend.telemetry.queries import median_recent_step_s
from detectors.serving import request_metrics

MAX_SERIES = 1000
# vLLM's bucket edges (vllm/v1/metrics/loggers.py), so dashboards built for vLLM read these.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
LABELS = ("job", "model", "replica")

TTFT = Histogram(
    "vigil_time_to_first_token_seconds",
    "Time to first token (first_token - arrival), per request.",
    LABELS,
    buckets=TTFT_BUCKETS,
    registry=REGISTRY,
)
TPOT = Histogram(
    "vigil_request_time_per_output_token_seconds",
    "Time per output token ((end - first_token) / (output_tokens - 1)), per request.",
    LABELS,
    buckets=TPOT_BUCKETS,
    registry=REGISTRY,
)
E2E = Histogram(
    "vigil_e2e_request_latency_seconds",
    "End-to-end request latency (end - arrival).",
    LABELS,
    buckets=E2E_BUCKETS,
    registry=REGISTRY,
)
QUEUE = Histogram(
    "vigil_request_queue_time_seconds",
    "Time requests waited before being scheduled, as the server reported it.",
    LABELS,
    buckets=E2E_BUCKETS,
    registry=REGISTRY,
)

_series: set[tuple[str, str, str]] = set()
_series_lock = threading.Lock()


def _labels(job: str, event: dict[str, Any]) -> tuple[str, str, str]:
    key = (job, event.get("model") or "", event.get("replica") or "")
    with _series_lock:
        if key in _series:
            return key
        if len(_series) < MAX_SERIES:
            _series.add(key)
            return key
    return (job, key[1], "other")


def observe_requests(job: str, requests: list[dict[str, Any]]) -> None:
    """At ingest, after the commit: each request into the serving histograms."""
    if not requests:
        return
    m = request_metrics(
        arrival=[e["arrival"] for e in requests],
        first_token=[e.get("first_token") for e in requests],
        end=[e.get("end") for e in requests],
        output_tokens=[e.get("output_tokens") for e in requests],
    )
    for i, e in enumerate(requests):
        labels = _labels(job, e)
        for hist, value in ((TTFT, m.ttft[i]), (TPOT, m.tpot[i]), (E2E, m.e2e[i])):
            if np.isfinite(value):
                hist.labels(*labels).observe(float(value))
        if e.get("queue_s") is not None:
            QUEUE.labels(*labels).observe(float(e["queue_s"]))


class JobsCollector(Collector):
    """Gauges read from the database at scrape time."""

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self.factory = factory

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self.factory() as session:
            yield from _slo_gauges(session)
            yield from _training_gauges(session)


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _slo_gauges(session: Session) -> Iterator[GaugeMetricFamily]:
    labels = ["job", "slo"]
    families = {
        "attainment": GaugeMetricFamily(
            "vigil_slo_attainment",
            "Fraction of requests meeting the SLO over its period.",
            labels=labels,
        ),
        "goodput_rps": GaugeMetricFamily(
            "vigil_slo_goodput_requests_per_second",
            "Requests/s meeting every threshold.",
            labels=labels,
        ),
        "smooth_goodput": GaugeMetricFamily(
            "vigil_slo_smooth_goodput",
            "Smooth goodput (arXiv 2410.14257) over the period.",
            labels=labels,
        ),
        "error_budget_remaining": GaugeMetricFamily(
            "vigil_slo_error_budget_remaining",
            "Error budget left over the period (1 = untouched).",
            labels=labels,
        ),
    }
    burn = _gauge(
        "vigil_slo_burn_rate",
        "Burn rate over each alert window.",
        [*labels, "window"],
    )
    now = time.time()
    for slo in slos.list_slos(session=session):
        st = slos.status(session=session, slo=slo, now=now)
        for key, family in families.items():
            if st[key] is not None:
                family.add_metric([slo.job, slo.name], float(st[key]))
        for rate in st["burn_rates"]:
            for window, value in (
                (rate["long_window_s"], rate["long_burn_rate"]),
                (rate["short_window_s"], rate["short_burn_rate"]),
            ):
                if value is not None:
                    burn.add_metric([slo.job, slo.name, f"{int(window)}s"], float(value))
    yield from families.values()
    yield burn


def _training_gauges(session: Session) -> Iterator[GaugeMetricFamily]:
    step = GaugeMetricFamily(
        "vigil_job_step_time_seconds",
        "Median step time over the recent steps of the job's current run.",
        labels=["job", "run"],
    )
    goodput = GaugeMetricFamily(
        "vigil_training_goodput",
        "Share of the current run's wall time spent on steps that were kept (0-1).",
        labels=["job", "run"],
    )
    jobs = session.execute(select(Job.id, Job.name, Job.kind, Job.run_id)).all()
    run_ids = [run_id for *_, run_id in jobs if run_id is not None]
    current = {r.id: r for r in session.scalars(select(Run).where(Run.id.in_(run_ids)))}
    names = {job_id: name for job_id, name, *_ in jobs}
    numbers: dict[int, str] = {}  # job id -> its current run's number, as a label
    for job_id, name, kind, run_id in jobs:
        run = current.get(run_id) if run_id is not None else None
        numbers[job_id] = str(run.number if run is not None else 1)
        if kind != "training":
            continue
        rows = RunRows.of(run, alone=False) if run is not None else None
        value = median_recent_step_s(session=session, job_id=job_id, run=rows)
        if value is not None:
            step.add_metric([name, numbers[job_id]], float(value))
        number = run.number if run is not None else None
        account = job_goodput(session=session, job_id=job_id, run=number)
        if account is not None and account["goodput"] is not None:
            goodput.add_metric([name, numbers[job_id]], float(account["goodput"]))
    yield step
    yield goodput
    age = GaugeMetricFamily(
        "vigil_job_last_heartbeat_age_seconds",
        "Seconds since the latest heartbeat from any rank of the job's current run "
        "(jobs seen in the last day).",
        labels=["job", "run"],
    )
    now = time.time()
    since = utcnow() - timedelta(days=1)
    for job_id, last in session.execute(
        select(Rank.job_id, func.max(Rank.last_heartbeat_ts))
        .join(Job, Job.id == Rank.job_id)
        .outerjoin(Run, Run.id == Job.run_id)
        .where(
            Rank.last_seen_at >= since,
            or_(Run.id.is_(None), Rank.attempt >= Run.first_attempt),  # its current run's
        )
        .group_by(Rank.job_id)
    ):
        if last is not None and job_id in names:
            age.add_metric([names[job_id], numbers[job_id]], max(0.0, now - float(last)))
    yield age
    open_by = GaugeMetricFamily(
        "vigil_open_incidents",
        "Open incidents by kind and severity, with the run they were opened in.",
        labels=["job", "run", "kind", "severity"],
    )
    counts: dict[tuple[str, str, str, str], int] = {}
    for job_id, kind, severity, fp in session.execute(
        select(Incident.job_id, Incident.kind, Incident.severity, Incident.fingerprint).where(
            Incident.status == "open"
        )
    ):
        key = (names.get(job_id, str(job_id)), str(run_of(fp)), kind, severity)
        counts[key] = counts.get(key, 0) + 1
    for key, n in sorted(counts.items()):
        open_by.add_metric(list(key), float(n))
    yield open_by
    score = GaugeMetricFamily(
        "vigil_straggler_score",
        "Score of each rank an open straggler incident names.",
        labels=["job", "run", "rank"],
    )
    for job_id, ranks, value, fp in session.execute(
        select(Incident.job_id, Incident.ranks, Incident.score, Incident.fingerprint).where(
            Incident.status == "open", Incident.kind == "straggler"
        )
    ):
        for rank in (ranks or [])[:64]:
            labels = [names.get(job_id, str(job_id)), str(run_of(fp)), str(rank)]
            score.add_metric(labels, float(value or 0.0))
    yield score


def exposition(factory: sessionmaker[Session]) -> bytes:
    """The whole ``/metrics`` body: Vigil's own metrics, the serving histograms, and the
    gauges read from the database now."""
    scrape = CollectorRegistry(auto_describe=False)
    scrape.register(JobsCollector(factory))
    return generate_latest(REGISTRY) + generate_latest(scrape)

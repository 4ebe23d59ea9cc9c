"""Prometheus metrics about Vigil itself, served at ``GET /metrics``."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

INGEST_BATCHES = Counter(
    "vigil_ingest_batches_total",
    "Ingest batches by outcome (stored, duplicate, rejected, throttled).",
    ["outcome"],
    registry=REGISTRY,
)
INGEST_REQUESTS = Counter(
    "vigil_ingest_requests_total",
    "Ingest HTTP requests by endpoint: single (POST /api/v1/ingest, one batch) or multi "
    "(POST /api/v1/ingest/multi, a relay's merged batches; each also counts in "
    "vigil_ingest_batches_total).",
    ["endpoint"],
    registry=REGISTRY,
)
INGEST_EVENTS = Counter(
    "vigil_ingest_events_total", "Stored events by type.", ["type"], registry=REGISTRY
)
INGEST_SECONDS = Histogram(
    "vigil_ingest_seconds",
    "Time to validate and store one batch.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    registry=REGISTRY,
)
TASK_RUNS = Counter(
    "vigil_task_runs_total",
    "Background task runs by task and outcome.",
    ["task", "outcome"],
    registry=REGISTRY,
)
TASK_SECONDS = Histogram(
    "vigil_task_seconds",
    "Time per background task run.",
    ["task"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
DETECTOR_FAILURES = Counter(
    "vigil_detector_failures_total",
    "Detector runs that raised (the other detectors of the run still applied).",
    ["detector"],
    registry=REGISTRY,
)


class PipelineGauges(Collector):
    """Is the pipeline behind the API working? Read at scrape time from ``source``, which
    the server sets (``backend.readiness.install``); a process without one reports none.

    - ``vigil_worker_alive``: workers that said they were alive in the last 10 s (embedded:
      1 while the in-process ticker runs);
    - ``vigil_beat_alive``: the same for beat;
    - ``vigil_detection_lag_seconds``: age of the oldest detection request not served yet
      (0 when none waits; absent when Redis does not answer);
    - ``vigil_detection_pending_jobs``: jobs with new data detection has not looked at.
    """

    HELP = {
        "vigil_worker_alive": "Workers alive (heartbeat within 10 s; embedded: ticker runs).",
        "vigil_beat_alive": "Beat processes alive (heartbeat within 10 s).",
        "vigil_detection_lag_seconds": "Age of the oldest detection request not served yet.",
        "vigil_detection_pending_jobs": "Jobs with data detection has not looked at yet.",
    }

    def __init__(self) -> None:
        self.source: Callable[[], Mapping[str, float]] | None = None

    def describe(self) -> Iterator[Metric]:
        for name, doc in self.HELP.items():
            yield GaugeMetricFamily(name, doc)

    def collect(self) -> Iterator[Metric]:
        if self.source is None:
            return
        try:
            values = self.source()
        except Exception:  # a scrape must not fail because the pipeline is unwell
            log.exception("could not read the pipeline gauges")
            return
        for name, doc in self.HELP.items():
            value = values.get(name)
            if value is not None and not math.isnan(value):
                yield GaugeMetricFamily(name, doc, value=float(value))


PIPELINE = PipelineGauges()
REGISTRY.register(PIPELINE)


class DetectorRuns(Collector):
    """``vigil_detector_runs_total{detector,outcome}`` (``ok`` or ``failed``), in both ways
    to run. Embedded: counted in this process, where detection runs. Distributed: detection
    runs in the workers, so each run is also added to a Redis hash (``KEY``) and a process
    with ``shared`` set (the API: ``backend.readiness.install``) reports the hash, the
    deployment's totals since Redis started."""

    KEY = "vigil:detector_runs"

    def __init__(self) -> None:
        self._local: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self.shared: Callable[[], Any] | None = None  # -> a Redis client, or None

    def record(self, detector: str, outcome: str, redis: Any = None) -> None:
        with self._lock:
            self._local[(detector, outcome)] = self._local.get((detector, outcome), 0) + 1
        if redis is not None:
            try:
                redis.hincrby(self.KEY, f"{detector}|{outcome}", 1)
            except Exception as exc:  # Redis away: the count is lost, never the run
                log.debug("detector run not counted in Redis: %s", exc)

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily("vigil_detector_runs", "Detector runs by outcome.")

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "vigil_detector_runs", "Detector runs by outcome.", labels=["detector", "outcome"]
        )
        redis = self.shared() if self.shared is not None else None
        if redis is not None:
            try:
                raw = redis.hgetall(self.KEY)
            except Exception as exc:
                log.debug("detector runs not read from Redis: %s", exc)
                raw = {}
            counts = {}
            for field, value in raw.items():
                name, _, outcome = _text(field).partition("|")
                counts[(name, outcome)] = int(value)
        else:
            with self._lock:
                counts = dict(self._local)
        for (name, outcome), n in sorted(counts.items()):
            family.add_metric([name, outcome], float(n))
        yield family


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


DETECTOR_RUNS = DetectorRuns()
REGISTRY.register(DETECTOR_RUNS)

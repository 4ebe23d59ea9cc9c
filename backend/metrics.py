"""Prometheus metrics about Vigil itself, served at ``GET /metrics``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

INGEST_BATCHES = Counter(
    "vigil_ingest_batches_total",
    "Ingest batches by outcome (stored, duplicate, rejected, throttled).",
    ["outcome"],
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

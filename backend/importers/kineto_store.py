"""Store Kineto iterations as a job's telemetry, through the ingest path, and judge them.

Each rank of a ``KinetoImport`` becomes one ingest batch (``backend.ingest.service``), so an
imported trace lands where a collector's data does and the detectors, charts and pages read
it unchanged:

- a ``step`` per iteration: ``duration_s`` = ProfilerStep#N's wall time, ``comm_s`` = the
  exposed communication (at most the step), ``opseq`` = the fingerprint;
- ``metric`` points per iteration with the GPU breakdown (``METRICS``, HTA's definitions);
- a ``collective`` per iteration and (group, op); an ``opseq`` per new fingerprint;
- a ``kineto_trace`` event naming the file, and a last heartbeat that says goodbye
  (``exiting``): the traced run is over, so the liveness sweep does not call its ranks hung
  or crashed, and its run ends as finished.

Then the window detectors run on the job in the same transaction (``runner.detect_job``):
a run that is over is not judged later (``backend.jobs.runs``), so an import is judged
when it lands. Like a Flight Recorder import, what they find is filed as incidents; no
alert or recovery follows (the job is gone).

The batch id is the SHA-256 of the rank's content: importing the same trace again stores
nothing twice (``duplicates`` in the reply), and a request is all stored or not at all.

    out = import_kineto(session=s, body=KinetoImport(...), job="llama", settings=settings)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.detection.runner import detect_job
from backend.errors import Invalid
from backend.importers.kineto_schemas import KinetoImport, RankIn
from backend.incidents.models import Incident
from backend.ingest.models import IngestBatch as IngestBatchRow
from backend.ingest.schemas import IngestBatch, format_loc
from backend.ingest.service import ingest_batch
from backend.jobs.models import Job
from backend.settings import Settings

# Metric names of the GPU breakdown, by ``GpuIn`` field.
METRICS = {
    "span_s": "kineto.gpu_span_s",
    "idle_s": "kineto.gpu_idle_s",
    "compute_s": "kineto.gpu_compute_s",
    "non_compute_s": "kineto.gpu_non_compute_s",
    "comm_s": "kineto.gpu_comm_s",
    "overlap_s": "kineto.gpu_overlap_s",
}
OVERLAP_PCT = "kineto.comm_overlap_pct"


@dataclass
class KinetoStored:
    job_id: int | None = None
    ranks: list[int] = field(default_factory=list)
    iterations: int = 0
    duplicates: list[int] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)


def _invalid(where: str, msg: str) -> Invalid:
    return Invalid([{"field": where, "msg": msg, "type": "kineto"}])


def check(body: KinetoImport) -> int:
    """The job's world size; ``Invalid`` naming the field when the body contradicts itself
    (a rank twice, a rank outside the world, a step twice in a rank)."""
    world = body.world_size or max(item.rank for item in body.ranks) + 1
    seen: dict[int, int] = {}
    for i, item in enumerate(body.ranks):
        if item.rank in seen:
            raise _invalid(
                f"ranks[{i}].rank", f"rank {item.rank} again (also ranks[{seen[item.rank]}])"
            )
        seen[item.rank] = i
        if item.rank >= world:
            raise _invalid(f"ranks[{i}].rank", f"rank {item.rank} is outside world_size {world}")
        steps: set[int] = set()
        for j, it in enumerate(item.iterations):
            if it.step in steps:
                raise _invalid(f"ranks[{i}].iterations[{j}].step", f"step {it.step} again")
            steps.add(it.step)
    return world


def events(item: RankIn) -> list[dict[str, Any]]:
    """The ingest events that store one rank's part of a trace."""
    out: list[dict[str, Any]] = []
    for it in item.iterations:
        step: dict[str, Any] = {
            "type": "step",
            "step": it.step,
            "ts": it.ts,
            "duration_s": it.duration_s,
        }
        if it.comm_s is not None:
            step["comm_s"] = min(it.comm_s, it.duration_s)
        if it.opseq is not None:
            step["opseq"] = it.opseq
        out.append(step)
        if it.gpu is not None:
            gpu = it.gpu.model_dump()
            out += [_metric(name, gpu[key], it.step, it.ts) for key, name in METRICS.items()]
            if it.gpu.comm_s > 0:
                pct = 100.0 * it.gpu.overlap_s / it.gpu.comm_s
                out.append(_metric(OVERLAP_PCT, pct, it.step, it.ts))
    out += [{"type": "collective", **c.model_dump(exclude_none=True)} for c in item.collectives]
    out += [{"type": "opseq", "hash": o.hash, "ops": o.ops} for o in item.opseqs]
    first, last = item.iterations[0], max(item.iterations, key=lambda it: it.ts)
    attrs = {"source": item.source, "iterations": len(item.iterations)}
    out.append(
        {
            "type": "event",
            "name": "kineto_trace",
            "step": first.step,
            "ts": first.ts,
            "attrs": attrs,
        }
    )
    out.append({"type": "heartbeat", "ts": last.ts, "step": last.step, "exiting": True})
    return out


def _metric(name: str, value: float, step: int, ts: float) -> dict[str, Any]:
    return {"type": "metric", "name": name, "value": value, "step": step, "ts": ts}


def _batch(
    i: int, item: RankIn, *, job: str, world: int, max_events: int
) -> tuple[IngestBatch, str]:
    """The rank's ingest batch and its content's SHA-256 (its id is made of it)."""
    evs = events(item)
    if len(evs) > max_events:
        raise _invalid(
            f"ranks[{i}]",
            f"{len(evs)} events exceed the server's {max_events} per batch "
            "(VIGIL_MAX_EVENTS_PER_BATCH): send fewer iterations per rank",
        )
    content = json.dumps(item.model_dump(mode="json"), sort_keys=True).encode()
    digest = hashlib.sha256(content).hexdigest()
    raw = {
        "batch_id": f"kineto-{digest[:40]}",
        "job": job,
        "kind": "training",
        "world_size": world,
        "rank": item.rank,
        "events": evs,
    }
    try:
        return IngestBatch.model_validate(raw), digest
    except ValidationError as exc:
        err = exc.errors(include_url=False, include_input=False)[0]
        raise _invalid(f"ranks[{i}]: {format_loc(tuple(err['loc']))}", err["msg"]) from None


def _stored_before(*, session: Session, job_id: int | None, batch_id: str) -> bool:
    """Whether the job has this batch already. Checked before ingest, which would take a
    repeated batch after the run's goodbye as the start of a new (empty) run."""
    if job_id is None:
        return False
    found = session.scalar(
        select(IngestBatchRow.batch_id).where(
            IngestBatchRow.job_id == job_id, IngestBatchRow.batch_id == batch_id
        )
    )
    return found is not None


def import_kineto(
    *, session: Session, body: KinetoImport, job: str, settings: Settings
) -> KinetoStored:
    """Store every rank of ``body`` as one ingest batch of ``job`` (created if new), then
    run the window detectors on the job when anything was new."""
    world = check(body)
    stored = KinetoStored(job_id=session.scalar(select(Job.id).where(Job.name == job)))
    fresh = False
    for i, item in enumerate(body.ranks):
        batch, digest = _batch(
            i, item, job=job, world=world, max_events=settings.max_events_per_batch
        )
        stored.ranks.append(item.rank)
        stored.iterations += len(item.iterations)
        if _stored_before(session=session, job_id=stored.job_id, batch_id=batch.batch_id):
            stored.duplicates.append(item.rank)
            continue
        result = ingest_batch(session=session, batch=batch, content_hash=digest)
        stored.job_id, fresh = result.job_id, True
    if fresh and stored.job_id is not None:
        changes = detect_job(
            session=session, job_id=stored.job_id, width=settings.detect_window_steps
        )
        stored.incidents = changes.opened + changes.reopened + changes.updated
    return stored

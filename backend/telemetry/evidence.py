"""The incident page's chart, chosen by what the incident is about.

    incident_chart(session=s, incident=row)   # {"chart": "numerics", "step": [...], ...}

| kind                               | chart        | what it draws                              |
|------------------------------------|--------------|--------------------------------------------|
| straggler, slowdown, anything else | ``compute``  | named ranks' compute time vs the median    |
| nan, loss_spike                    | ``numerics`` | loss and grad norm, non-finite steps marked|
| hang, crash                        | ``liveness`` | each rank's last steps and last heartbeat  |
| comm_anomaly                       | ``bandwidth``| slow groups' bandwidth vs the other groups |
| a Flight Recorder import           | ``none``     | nothing: the page shows the dumps' table   |

Each reads a bounded window around the incident's first step (at most ``WINDOW_ROWS`` rows),
so the chart costs the same for any job size.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Double, cast, func, select
from sqlalchemy.orm import Session

from backend.incidents.models import Incident
from backend.jobs.models import Rank
from backend.telemetry.binning import Extent
from backend.telemetry.models import CollectiveRecord, StepRecord
from backend.telemetry.queries import evidence_chart as compute_chart
from backend.telemetry.queries import num

CHART_OF_KIND = {
    "nan": "numerics",
    "loss_spike": "numerics",
    "hang": "liveness",
    "crash": "liveness",
    "comm_anomaly": "bandwidth",
}
WINDOW_ROWS = 100_000  # step or collective rows a chart may read
LIVENESS_STEPS = 20  # last steps drawn per rank
LIVENESS_RANKS = 64  # ranks drawn (the named ones first)
SLOW_GROUPS = 8  # slow groups drawn one by one; the others as their median


def chart_kind(incident: Incident) -> str:
    """Which chart fits ``incident`` (see the module doc)."""
    if (incident.evidence or {}).get("source") == "flight_recorder":
        return "none"
    return CHART_OF_KIND.get(incident.kind, "compute")


def incident_chart(*, session: Session, incident: Incident) -> dict[str, Any]:
    """The chart's data: ``chart`` names it, the other keys are that chart's series."""
    kind = chart_kind(incident)
    if kind == "none":
        return {"chart": "none", "first_step": incident.first_step}
    if kind == "numerics":
        out = numerics_chart(
            session=session, job_id=incident.job_id, first_step=incident.first_step
        )
    elif kind == "liveness":
        out = liveness_chart(session=session, incident=incident)
    elif kind == "bandwidth":
        out = bandwidth_chart(session=session, incident=incident)
    else:
        out = compute_chart(
            session=session,
            job_id=incident.job_id,
            ranks=incident.ranks or [],
            first_step=incident.first_step,
        )
    return {"chart": kind, **out}


def _window(session: Session, job_id: int, center: int | None) -> tuple[int, int] | None:
    """Steps ``lo..hi`` around ``center`` (the last step if None) that fit ``WINDOW_ROWS``."""
    ext = Extent.of(session, job_id)
    if ext is None:
        return None
    mid = ext.last_step if center is None else int(center)
    half = max(5, min(100, WINDOW_ROWS // (2 * ext.ranks)))
    return max(ext.first_step, mid - half), min(ext.last_step, mid + half)


def _median(values: Iterable[float | None]) -> float | None:
    finite = [v for v in values if v is not None and v == v and abs(v) != float("inf")]
    return statistics.median(finite) if finite else None


def numerics_chart(*, session: Session, job_id: int, first_step: int | None) -> dict[str, Any]:
    """Loss and grad norm per step (median over ranks of the finite values) around
    ``first_step``, and the steps where some rank reported a non-finite value."""
    out: dict[str, Any] = {"step": [], "loss": [], "grad_norm": [], "first_step": first_step}
    out["nonfinite"] = {"loss": [], "grad_norm": []}
    span = _window(session, job_id, first_step)
    if span is None:
        return out
    rows = session.execute(
        select(StepRecord.step, StepRecord.loss, StepRecord.grad_norm).where(
            StepRecord.job_id == job_id, StepRecord.step.between(*span)
        )
    ).all()
    by_step: dict[int, tuple[list[float | None], list[float | None]]] = {}
    for step, loss, grad in rows:
        losses, grads = by_step.setdefault(int(step), ([], []))
        losses.append(loss)
        grads.append(grad)
    for step in sorted(by_step):
        losses, grads = by_step[step]
        out["step"].append(step)
        out["loss"].append(num(_median(losses)))
        out["grad_norm"].append(num(_median(grads)))
        for name, values in (("loss", losses), ("grad_norm", grads)):
            if any(v is not None and num(v) is None for v in values):
                out["nonfinite"][name].append(step)
    return out


def _liveness_ranks(session: Session, incident: Incident) -> list[Rank]:
    named = set(incident.ranks or [])
    states = list(session.scalars(select(Rank).where(Rank.job_id == incident.job_id)))
    states.sort(key=lambda r: (r.rank not in named, r.rank))
    return sorted(states[:LIVENESS_RANKS], key=lambda r: r.rank)


def liveness_chart(*, session: Session, incident: Incident) -> dict[str, Any]:
    """Each rank's last ``LIVENESS_STEPS`` step ends before the incident was detected and
    its latest heartbeat, in seconds relative to detection (negative: before), with the
    collective it was in; the named ranks (culprits, crashed ranks) flagged."""
    ref = incident.detected_at.timestamp()
    ranks = _liveness_ranks(session, incident)
    named = set(incident.ranks or [])
    ends: dict[int, list[tuple[int, float]]] = {r.rank: [] for r in ranks}
    if ranks:
        last = select(func.max(StepRecord.step)).where(
            StepRecord.job_id == incident.job_id, StepRecord.ts <= ref
        )
        top = session.scalar(last)
        if top is not None:
            rows = session.execute(
                select(StepRecord.rank, StepRecord.step, StepRecord.ts).where(
                    StepRecord.job_id == incident.job_id,
                    StepRecord.rank.in_(list(ends)),
                    StepRecord.step.between(int(top) - LIVENESS_STEPS, int(top)),
                    StepRecord.ts <= ref,
                )
            ).all()
            for rank, step, ts in rows:
                ends[int(rank)].append((int(step), float(ts)))
    out_ranks = []
    for r in ranks:
        steps = sorted(ends[r.rank])[-LIVENESS_STEPS:]
        beat = r.last_heartbeat_ts
        out_ranks.append(
            {
                "rank": r.rank,
                "named": r.rank in named,
                "step": [s for s, _ in steps],
                "step_end_s": [round(ts - ref, 3) for _, ts in steps],
                "last_step": r.last_step,
                "heartbeat_s": round(beat - ref, 3) if beat is not None else None,
                "inflight": _inflight_text(r.inflight),
                "exited": bool(r.exited),
            }
        )
    return {"first_step": incident.first_step, "liveness": out_ranks}


def _inflight_text(inflight: dict[str, Any] | None) -> str | None:
    if not inflight:
        return None
    return f"{inflight.get('group', '?')} {inflight.get('op', '?')} #{inflight.get('seq', '?')}"


def _slow_groups(evidence: dict[str, Any]) -> list[str]:
    return [str(g["group"]) for g in evidence.get("slow_groups") or [] if "group" in g]


def bandwidth_chart(*, session: Session, incident: Incident) -> dict[str, Any]:
    """Bandwidth (GB/s: bytes ÷ seconds over ranks and ops) per step of the incident's slow
    groups, each its own series, and the median of the job's other groups for comparison."""
    slow = _slow_groups(incident.evidence or {})[:SLOW_GROUPS]
    out: dict[str, Any] = {"first_step": incident.first_step, "groups": []}
    span = _window(session, incident.job_id, incident.first_step)
    if span is None:
        return out
    c = CollectiveRecord
    rows = session.execute(
        select(c.group, c.step, func.sum(cast(c.bytes, Double)), func.sum(c.duration_s))
        .where(c.job_id == incident.job_id, c.step.between(*span), c.duration_s > 0)
        .group_by(c.group, c.step)
        .limit(WINDOW_ROWS)
    ).all()
    per: dict[str, dict[int, float]] = {}
    for group, step, total, seconds in rows:
        per.setdefault(group, {})[int(step)] = float(total or 0) / float(seconds) / 1e9
    steps = sorted({s for values in per.values() for s in values})
    for group in slow:
        values = per.get(group, {})
        out["groups"].append(
            {
                "group": group,
                "slow": True,
                "step": steps,
                "gbps": [num(values.get(s)) for s in steps],
            }
        )
    others = [values for group, values in per.items() if group not in slow]
    if others:
        median = [num(_median(v.get(s) for v in others)) for s in steps]
        label = "the other groups (median)" if slow else "all groups (median)"
        out["groups"].append({"group": label, "slow": False, "step": steps, "gbps": median})
    return out

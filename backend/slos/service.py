"""SLOs: definitions (CRUD), judging requests at ingest, and their status over a range.

    slo = create_slo(session=s, job="chat", name="interactive", ttft_s=0.5, tpot_s=0.05,
                     objective=0.99, period_s=28 * 86400)
    add_slo_minutes(session=s, job="chat", requests=[…request events…])   # at ingest
    status(session=s, slo=slo, now=time.time())    # attainment, goodput, budget, burn rates

Every finished request of the job (of the SLO's model, when it names one) is judged against
each threshold the SLO sets, as ``detectors.serving`` defines them, and counted in
``slo_minutes`` (the minute it finished). A new or changed SLO is recomputed from the
stored requests of its period, so its figures always describe its current thresholds.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend.db import add_sums, utcnow
from backend.errors import Conflict, Invalid, NotFound
from backend.ingest.tokens import TokenTimesError, decode_offsets
from backend.jobs.models import Job
from backend.slos.models import THRESHOLDS, Slo, SloMinute
from backend.telemetry.models import ServingRequest
from backend.telemetry.serving import finished_at
from detectors import burn_rate, serving
from detectors.smooth_goodput import SmoothParams, smooth_scores

COUNTS = (
    "total",
    "good",
    "good_ttft",
    "good_tpot",
    "good_max_tbt",
    "good_e2e",
    "good_tokens",
    "smooth",
)
DEFAULT_PERIOD_S = 28 * 86400.0
REBUILD_BATCH = 50_000


class SloNameTaken(Conflict):
    pass


def _check(values: dict[str, Any]) -> None:
    if not any(values.get(t) is not None for t in THRESHOLDS):
        raise Invalid(f"set at least one threshold: {', '.join(THRESHOLDS)}")
    objective = values.get("objective")
    if objective is not None and not 0 < objective < 1:
        raise Invalid("objective: must be between 0 and 1 (e.g. 0.99), exclusive")


def create_slo(*, session: Session, job: str, name: str, **values: Any) -> Slo:
    """A new SLO for ``job``; its counts are computed from the requests already stored."""
    values.setdefault("objective", 0.99)
    values.setdefault("period_s", DEFAULT_PERIOD_S)
    _check(values)
    if session.scalar(select(Slo.id).where(Slo.job == job, Slo.name == name)) is not None:
        raise SloNameTaken(f"job {job!r} already has an SLO named {name!r}")
    now = utcnow()
    slo = Slo(job=job, name=name, created_at=now, updated_at=now, **values)
    session.add(slo)
    try:
        session.flush()
    except IntegrityError:
        raise SloNameTaken(f"job {job!r} already has an SLO named {name!r}") from None
    rebuild(session=session, slo=slo)
    return slo


def update_slo(*, session: Session, slo: Slo, **changes: Any) -> Slo:
    """Change an SLO's name, thresholds, objective or period; its counts are recomputed."""
    merged = {k: getattr(slo, k) for k in (*THRESHOLDS, "objective", "period_s")} | changes
    _check(merged)
    for key, value in changes.items():
        setattr(slo, key, value)
    slo.updated_at = utcnow()
    job, name = slo.job, slo.name  # after a failed flush the row can no longer be read
    try:
        session.flush()
    except IntegrityError:
        raise SloNameTaken(f"job {job!r} already has an SLO named {name!r}") from None
    rebuild(session=session, slo=slo)
    return slo


def get_slo(*, session: Session, slo_id: int) -> Slo:
    slo = session.get(Slo, slo_id)
    if slo is None:
        raise NotFound(f"SLO {slo_id} not found")
    return slo


def list_slos(*, session: Session, job: str | None = None) -> list[Slo]:
    query = select(Slo).order_by(Slo.job, Slo.name)
    if job is not None:
        query = query.where(Slo.job == job)
    return list(session.scalars(query))


def delete_slo(*, session: Session, slo: Slo) -> None:
    session.execute(delete(SloMinute).where(SloMinute.slo_id == slo.id))
    session.delete(slo)
    session.flush()


# --- judging requests -------------------------------------------------------------------------


def judge(slo: Slo, requests: list[dict[str, Any]]) -> dict[tuple[int, int], dict[str, float]]:
    """Count ``requests`` (ingest events, or rows as dicts) against ``slo``, per minute:
    ``{(slo_id, minute): {"total": …, "good": …, …}}``. Requests of another model are
    skipped; unfinished ones (no ``end``) are not judged yet."""
    mine = [
        r
        for r in requests
        if r.get("end") is not None and (slo.model is None or r.get("model") == slo.model)
    ]
    if not mine:
        return {}
    metrics = serving.request_metrics(
        arrival=[r["arrival"] for r in mine],
        first_token=[r.get("first_token") for r in mine],
        end=[r["end"] for r in mine],
        output_tokens=[r.get("output_tokens") for r in mine],
        max_tbt_s=[r.get("max_tbt_s") for r in mine],
        status=[r.get("status") or "ok" for r in mine],
    )
    joint, per = serving.meets(metrics, **slo.thresholds())
    counted = serving.judged(metrics, **slo.thresholds())
    smooth = _smooth_scores(mine, SmoothParams(ttft_s=slo.ttft_s))
    out: dict[tuple[int, int], dict[str, float]] = defaultdict(lambda: dict.fromkeys(COUNTS, 0))
    for i, r in enumerate(mine):
        if not counted[i]:
            continue  # left by the client while still on time: neither good nor bad
        acc = out[(slo.id, int(finished_at(r) // 60))]
        acc["total"] += 1
        acc["good"] += bool(joint[i])
        for t in THRESHOLDS:
            acc[f"good_{t.removesuffix('_s')}"] += bool(per[t][i]) if t in per else 0
        if joint[i]:
            acc["good_tokens"] += int(r.get("output_tokens") or 0)
        acc["smooth"] += float(smooth[i])
    return out


def _smooth_scores(requests: list[dict[str, Any]], params: SmoothParams) -> np.ndarray[Any, Any]:
    """Each request's smooth-goodput benefit from its token times
    (``detectors.smooth_goodput``), one vectorised call for the batch; requests without
    token times score from first token, end and token count. With the SLO's TTFT,
    deadlines start at ``arrival + ttft_s``, so a late first token costs too."""
    offsets: list[list[float] | None] = []
    strides: list[int] = []
    for r in requests:
        stride = (r.get("token_times") or {}).get("stride") or r.get("token_stride") or 1
        found = r.get("_token_offsets")
        if found is None and r.get("token_deltas") is not None:
            try:
                found = decode_offsets(
                    r["token_deltas"], stride=stride, output_tokens=r.get("output_tokens") or 0
                )
            except TokenTimesError:
                found = None
        offsets.append(found)
        strides.append(stride)
    return smooth_scores(
        arrival=[r["arrival"] for r in requests],
        first_token=[r.get("first_token") for r in requests],
        end=[r.get("end") for r in requests],
        output_tokens=[r.get("output_tokens") for r in requests],
        status=[r.get("status") or "ok" for r in requests],
        token_offsets=offsets,
        stride=strides,
        params=params,
    )


def add_slo_minutes(*, session: Session, job: str, requests: list[dict[str, Any]]) -> None:
    """At ingest: count a batch of request events against every SLO of ``job``."""
    slos = list(session.scalars(select(Slo).where(Slo.job == job)))
    rows = []
    for slo in slos:
        for (slo_id, minute), counts in judge(slo, requests).items():
            rows.append({"slo_id": slo_id, "minute": minute, **counts})
    add_sums(session, SloMinute, keys=["slo_id", "minute"], sums=list(COUNTS), rows=rows)


def rebuild(*, session: Session, slo: Slo, now: float | None = None) -> None:
    """Recompute an SLO's minutes from the stored requests of its period."""
    session.execute(delete(SloMinute).where(SloMinute.slo_id == slo.id))
    job_id = session.scalar(select(Job.id).where(Job.name == slo.job))
    if job_id is None:
        return
    since = (now if now is not None else utcnow().timestamp()) - slo.period_s
    columns = [c for c in ServingRequest.__table__.columns if c.key not in ("id", "job_id")]
    query = (
        select(*columns)
        .where(ServingRequest.job_id == job_id, ServingRequest.arrival >= since)
        .execution_options(yield_per=REBUILD_BATCH)
    )
    for part in session.execute(query).mappings().partitions(REBUILD_BATCH):
        rows = [dict(r) for r in part]
        counts = judge(slo, rows)
        add_sums(
            session,
            SloMinute,
            keys=["slo_id", "minute"],
            sums=list(COUNTS),
            rows=[{"slo_id": s, "minute": m, **c} for (s, m), c in counts.items()],
        )
    session.flush()


# --- status -----------------------------------------------------------------------------------


def minute_counts(
    *, session: Session, slo_id: int, first_minute: int, last_minute: int
) -> dict[str, np.ndarray[Any, Any]]:
    """Dense per-minute arrays of the SLO's counts over ``first_minute..last_minute``."""
    n = last_minute - first_minute + 1
    out = {c: np.zeros(n) for c in COUNTS}
    rows = session.execute(
        select(SloMinute.minute, *(getattr(SloMinute, c) for c in COUNTS)).where(
            SloMinute.slo_id == slo_id,
            SloMinute.minute >= first_minute,
            SloMinute.minute <= last_minute,
        )
    ).all()
    for row in rows:
        i = int(row[0]) - first_minute
        for j, c in enumerate(COUNTS, start=1):
            out[c][i] = float(row[j])
    return out


def period_counts(*, session: Session, slo: Slo, now: float) -> tuple[float, float]:
    """``(total, good)`` over the SLO's period up to ``now``: what its error budget is
    measured against."""
    row = session.execute(
        select(
            func.coalesce(func.sum(SloMinute.total), 0), func.coalesce(func.sum(SloMinute.good), 0)
        ).where(SloMinute.slo_id == slo.id, SloMinute.minute > int((now - slo.period_s) // 60))
    ).one()
    return float(row[0]), float(row[1])


def status(
    *,
    session: Session,
    slo: Slo,
    now: float,
    since: float | None = None,
    until: float | None = None,
) -> dict[str, Any]:
    """Attainment (joint and per threshold), goodput, smooth goodput, error budget left
    and burn rates, over ``since..until`` (default: the SLO's period up to ``now``)."""
    until = now if until is None else until
    since = until - slo.period_s if since is None else since
    if since > until:
        raise Invalid("since: must not be after until")
    sums = session.execute(
        select(*(func.coalesce(func.sum(getattr(SloMinute, c)), 0) for c in COUNTS)).where(
            SloMinute.slo_id == slo.id,
            SloMinute.minute >= int(since // 60),
            SloMinute.minute <= int(until // 60),
        )
    ).one()
    total = dict(zip(COUNTS, (float(v) for v in sums), strict=True))
    seconds = max(until - since, 1e-9)
    judged = total["total"]

    def ratio(key: str) -> float | None:
        return total[key] / judged if judged else None

    attainment = ratio("good")
    budget = (
        None
        if attainment is None
        else float(np.clip(1 - (1 - attainment) / (1 - slo.objective), -1e9, 1))
    )
    last = int(now // 60)
    tiers = burn_rate.windows_for(slo.period_s)
    longest = max(w.long_minutes for w in tiers)
    counts = minute_counts(
        session=session, slo_id=slo.id, first_minute=last - longest + 1, last_minute=last
    )
    rates = burn_rate.burn_rates(counts["total"], counts["good"], slo.objective, tiers)
    return {
        "requests": int(judged),
        "attainment": attainment,
        "attainment_by_threshold": {
            t: ratio(f"good_{t.removesuffix('_s')}") for t in slo.thresholds()
        },
        "goodput_rps": total["good"] / seconds,
        "goodput_tokens_per_s": total["good_tokens"] / seconds,
        "smooth_goodput": total["smooth"] / seconds,
        "error_budget_remaining": budget,
        "burn_rates": rates,
        "since": since,
        "until": until,
    }

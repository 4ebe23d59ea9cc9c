"""Each rank's normal speed, learned once per job attempt and kept across detection runs.

The straggler detector compares a rank's compute time with the fast ranks' and divides by
the rank's *normal* ratio, so hardware that is always a little slower never fires. Learned
afresh from every 200-step window, that normal would absorb a slowdown that lasts: once the
window has slid past its onset, the slow steps *are* the window's first steps. So the
backend learns each rank's normal once (``detectors.straggler.learn_baselines``, from the
first ``learn_steps`` (100) steps of the first window that has them; until then each window
estimates its own) and passes it back to every later window.

Where it is kept: in distributed mode in Redis (a hash per job attempt, 7 days' expiry),
so every Celery worker uses the same values; embedded, in this process (bounded). If it is
lost (Redis flushed, the server restarted) it is learned again from the current window,
which is what every window did before.

    window = attach(job=job, window=window, redis=None)
    window.straggler_baseline   # (R,) ratios, NaN where a rank is not known yet

The detector also judges each window afresh, so a rank slower by just about the threshold
(a group 1.10x slower against a 10% threshold) would have to cross it again in every
window. What it was named for is kept too, where it already is: the job's open straggler
incidents. :func:`attach_named` hands the detector, per rank, the first step of its open
incident; such a rank stays named while it stays at the hold level, half the threshold.

    window = attach_named(session=session, job=job, window=window)
    window.straggler_since      # (R,) step ids, NaN where a rank has no open incident
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.incidents.models import Incident
from backend.incidents.service import fingerprint
from backend.jobs.models import Job
from backend.jobs.runs import current_run_number
from detectors.straggler import learn_baselines
from detectors.window import StepWindow

TTL_S = 7 * 24 * 3600
MAX_LOCAL_JOBS = 1024
_local: OrderedDict[str, dict[int, float]] = OrderedDict()


def attach(*, job: Job, window: StepWindow, redis: Any = None) -> StepWindow:
    """``window`` with ``straggler_baseline`` filled from what is kept, learning (and
    keeping) the ranks not known yet when the window allows."""
    key = _key(job)
    known = _load(key, redis)
    base = np.array([known.get(int(r), np.nan) for r in window.ranks], dtype=np.float64)
    todo = ~np.isfinite(base)
    if todo.any():
        comm = window.comm_time if window.has_comm else None
        learned = learn_baselines(window.steps, window.step_time, comm)
        new = todo & np.isfinite(learned)
        if new.any():
            values = {
                int(r): float(v) for r, v in zip(window.ranks[new], learned[new], strict=True)
            }
            _store(key, values, redis)
            base[new] = learned[new]
    return dataclasses.replace(window, straggler_baseline=base)


def attach_named(*, session: Session, job: Job, window: StepWindow) -> StepWindow:
    """``window`` with ``straggler_since``: for each rank with an open straggler incident of
    the job's current run, that incident's first step; NaN for the others."""
    run = current_run_number(session=session, job_id=job.id)
    prefix = fingerprint(job.id, "straggler:", run)
    rows = session.execute(
        select(Incident.ranks, Incident.first_step).where(
            Incident.job_id == job.id,
            Incident.kind == "straggler",
            Incident.status == "open",
            Incident.fingerprint.startswith(prefix, autoescape=True),
        )
    ).all()
    since = {int(r): first for ranks, first in rows if first is not None for r in ranks or ()}
    named = np.array([since.get(int(r), np.nan) for r in window.ranks], dtype=np.float64)
    return dataclasses.replace(window, straggler_since=named)


def _key(job: Job) -> str:
    created = job.created_at.timestamp() if job.created_at is not None else 0.0
    return f"vigil:straggler-baseline:{job.id}:{created:.6f}:{job.attempt}"


def _load(key: str, redis: Any) -> dict[int, float]:
    if redis is None:
        found = _local.get(key)
        if found is not None:
            _local.move_to_end(key)
        return dict(found or {})
    try:
        raw = redis.hgetall(key)
    except Exception:  # Redis away: learn from this window, as if nothing were kept
        return {}
    return {int(r): float(v) for r, v in raw.items()}


def _store(key: str, values: dict[int, float], redis: Any) -> None:
    if redis is None:
        _local.setdefault(key, {}).update(values)
        _local.move_to_end(key)
        while len(_local) > MAX_LOCAL_JOBS:
            _local.popitem(last=False)
        return
    try:
        pipe = redis.pipeline()
        pipe.hset(key, mapping={str(r): repr(v) for r, v in values.items()})
        pipe.expire(key, TTL_S)
        pipe.execute()
    except Exception:  # kept next time, or learned again: never fail a detection run
        return

"""Run the detectors for a job and apply their findings as incidents.

Two kinds of run:
- ``detect_job`` after new data: the window detectors (stragglers, numerics, …);
- ``sweep_job`` on a timer: hangs and crashes, which show as the *absence* of data.
Both take a session and leave commit to the caller.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.db import utcnow
from backend.detection.window import (
    Window,
    group_members,
    load_collectives,
    load_window,
    rank_states,
    recent_step_durations,
)
from backend.incidents.service import Changes, apply_findings
from backend.jobs.models import Rank
from detectors import comm, hang, numerics, slowdown, straggler
from detectors.finding import Finding

log = logging.getLogger(__name__)

WINDOW_KINDS = frozenset({"straggler", "nan", "loss_spike", "slowdown", "comm_anomaly"})
SWEEP_KINDS = frozenset({"hang", "crash"})


def detect_job(*, session: Session, job_id: int, width: int = 200) -> Changes:
    window = load_window(session=session, job_id=job_id, width=width)
    if window is None:
        return Changes()
    findings: list[Finding] = []
    findings += straggler.detect_stragglers(
        window.steps,
        window.step_time,
        comm_time=window.comm_time if window.has_comm else None,
        ranks=window.ranks,
    )
    # Unsent grad norms must not read as NaN: the detector only looks for non-finite ones.
    grad = np.where(window.grad_reported, window.grad_norm, 0.0)
    findings += numerics.detect_numerics(
        window.loss, grad, steps=window.steps, reported=window.loss_reported
    )
    findings += slowdown.detect_slowdown(
        window.step_time,
        np.nan_to_num(window.comm_time),
        np.nan_to_num(window.data_time),
        steps=window.steps,
    )
    findings += _comm_findings(session=session, job_id=job_id, window=window)
    return apply_findings(
        session=session, job_id=job_id, findings=findings, covered_kinds=WINDOW_KINDS
    )


def _comm_findings(*, session: Session, job_id: int, window: Window) -> list[Finding]:
    colls = load_collectives(session=session, job_id=job_id, window=window)
    if colls is None:
        return []
    families, steps = comm.families_from_records(
        colls.rank,
        colls.step,
        colls.group,
        colls.op,
        colls.nbytes,
        colls.duration_s,
        members=colls.members,
    )
    return comm.detect_comm(families, steps=steps)


def sweep_job(*, session: Session, job_id: int, now: float) -> Changes:
    states = [
        hang.RankState(
            rank=r.rank,
            last_step=r.last_step,
            current_step=r.current_step,
            last_step_ts=r.last_step_ts,
            last_heartbeat_ts=r.last_heartbeat_ts
            if r.last_heartbeat_ts is not None
            else (r.last_step_ts or 0.0),
            inflight=_inflight(r.inflight),
        )
        for r in rank_states(session=session, job_id=job_id)
        if not r.exited
    ]
    if not states:  # every rank said goodbye: the job ended; nothing hangs or crashed
        return apply_findings(
            session=session, job_id=job_id, findings=[], covered_kinds=SWEEP_KINDS
        )
    durations = np.asarray(recent_step_durations(session=session, job_id=job_id), dtype=float)
    findings = hang.detect(
        states,
        now=now,
        step_durations=durations,
        groups=group_members(session=session, job_id=job_id) or None,
        # Ranks that exit cleanly say so; all going silent together without a word is
        # a crash (a launcher tearing the group down after one rank died), not an end.
        finished=False,
    )
    return apply_findings(
        session=session, job_id=job_id, findings=findings, covered_kinds=SWEEP_KINDS
    )


def _inflight(raw: dict[str, object] | None) -> hang.Inflight | None:
    if not raw:
        return None
    try:
        return hang.Inflight(
            group=str(raw["group"]),
            op=str(raw["op"]),
            seq=int(raw.get("seq") or 0),  # type: ignore[call-overload]
            since=float(raw["since"]),  # type: ignore[arg-type]
        )
    except (KeyError, TypeError, ValueError):
        return None


def active_jobs(*, session: Session, within_s: float = 3600) -> list[int]:
    """Jobs that reported within ``within_s``: the ones a sweep should look at."""
    since = utcnow() - timedelta(seconds=within_s)
    return list(session.scalars(select(Rank.job_id).where(Rank.last_seen_at >= since).distinct()))

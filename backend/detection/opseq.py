"""Load the ``opseq`` part of a detection window (:class:`detectors.window.OpSeqWindow`).

Over the steps and ranks of the run's step window (the settled one, so both parts judge
the same steps): the ``shape_fp`` each rank's step record carried, and the job's record of
those fingerprints (``shape_fingerprints``, kept by ingest) with the structure of the op
sequence behind each (``opseqs.structure``) once a captured step covered it. In a steady
state (no fingerprint first seen within the window) it costs two small queries.

    opseq = load_opseq(session=session, job_id=job.id, window=steps)  # None: no fingerprints
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from backend.jobs.models import Job
from backend.swap.models import ShapeFingerprint
from backend.telemetry.models import OpSequence, StepRecord
from detectors.window import OpSeqWindow, ShapeInfo, StepWindow

_IN_CHUNK = 500  # fingerprints per IN list


def load_opseq(*, session: Session, job_id: int, window: StepWindow) -> OpSeqWindow | None:
    """The window's fingerprints; None when the job has none. When none of them was first
    seen within the window (the steady state) the grid is left empty and not read: the
    detector would find nothing in it."""
    if window.steps.size == 0:
        return None
    sf = ShapeFingerprint
    first_ever = session.scalar(select(func.min(sf.first_step)).where(sf.job_id == job_id))
    if first_ever is None:
        return None
    empty = OpSeqWindow(
        steps=window.steps,
        ranks=window.ranks,
        codes=np.broadcast_to(np.int64(-1), (window.ranks.size, window.steps.size)),
        fingerprints=(),
        known={},
        job_first_step=first_ever,
    )
    new = session.scalar(
        select(sf.shape_fp)
        .where(
            sf.job_id == job_id,
            sf.first_step >= int(window.steps[0]),
            sf.first_step <= int(window.steps[-1]),
        )
        .limit(1)
    )
    if new is None:
        return empty
    attempt = session.scalar(select(Job.attempt).where(Job.id == job_id)) or 0
    rows = session.execute(
        select(StepRecord.rank, StepRecord.step, StepRecord.shape_fp).where(
            StepRecord.job_id == job_id,
            StepRecord.attempt == attempt,
            StepRecord.step >= int(window.steps[0]),
            StepRecord.step <= int(window.steps[-1]),
            StepRecord.shape_fp.is_not(None),
        )
    ).all()
    if not rows:
        return empty
    names = tuple(sorted({r.shape_fp for r in rows}))
    index = {fp: i for i, fp in enumerate(names)}
    rank = np.array([r.rank for r in rows], dtype=np.int64)
    step = np.array([r.step for r in rows], dtype=np.int64)
    ri = np.searchsorted(window.ranks, rank).clip(0, max(window.ranks.size - 1, 0))
    si = np.searchsorted(window.steps, step).clip(0, window.steps.size - 1)
    inside = (window.ranks[ri] == rank) & (window.steps[si] == step)
    codes = np.full((window.ranks.size, window.steps.size), -1, dtype=np.int64)
    code = np.array([index[r.shape_fp] for r in rows], dtype=np.int64)
    codes[ri[inside], si[inside]] = code[inside]
    known = _known(session=session, job_id=job_id, fingerprints=names)
    return replace(empty, codes=codes, fingerprints=names, known=known)


def _known(*, session: Session, job_id: int, fingerprints: tuple[str, ...]) -> dict[str, ShapeInfo]:
    """The job's record of ``fingerprints``, with the structure of their op sequences."""
    sf, ops = ShapeFingerprint, OpSequence
    known: dict[str, ShapeInfo] = {}
    for at in range(0, len(fingerprints), _IN_CHUNK):
        chunk = fingerprints[at : at + _IN_CHUNK]
        rows = session.execute(
            select(sf.shape_fp, sf.first_step, sf.opseq, ops.structure)
            .outerjoin(ops, and_(ops.job_id == sf.job_id, ops.hash == sf.opseq))
            .where(sf.job_id == job_id, sf.shape_fp.in_(chunk))
        ).all()
        for r in rows:
            known[r.shape_fp] = ShapeInfo(
                first_step=int(r.first_step), opseq=r.opseq, structure=r.structure
            )
    return known

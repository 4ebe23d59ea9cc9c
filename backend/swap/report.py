"""A job's activation swapping as people and the API read it.

    job_swap(session=session, job_id=7)
    # {"fingerprints": [{"shape_fp", "first_step", "opseq", "change"}, …],
    #  "policies": [{"version", "opseq", "state", "reason", "budget_bytes", …}, …],
    #  "active": 3}

``fingerprints``: the shapes the job's steps ran, in the order they first appeared (the
latest ``MAX_FINGERPRINTS``), each with the op sequence a captured step of it reported and
how it differs from the one before: ``first``, ``structure`` (other ops), ``shapes`` (the
same ops on other shapes), ``same`` (the same op sequence), or ``unknown`` while either op
sequence is (the words of the ``opseq_change`` evidence, ``detectors.opseq``).
``policies``: every policy made for the job (the latest ``MAX_POLICIES``) by version;
``active``: the version the job's latest steps run (``backend.swap.service``).
The REST endpoint and the job page's "Activation swapping" section both read this.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, select
from sqlalchemy.orm import Session

from backend.swap.models import ShapeFingerprint, SwapPolicy
from backend.telemetry.models import OpSequence

__all__ = ["MAX_FINGERPRINTS", "MAX_POLICIES", "describe", "human_bytes", "job_swap"]

MAX_FINGERPRINTS = 1000
MAX_POLICIES = 200
POLICY_FIELDS = (
    "version",
    "opseq",
    "state",
    "reason",
    "budget_bytes",
    "predicted_peak_bytes",
    "measured_peak_bytes",
    "predicted_exposed_s",
    "feasible",
    "applied_step",
    "created_at",
)


def job_swap(*, session: Session, job_id: int) -> dict[str, Any]:
    """The job's shape fingerprints, its policies and the active version (module doc)."""
    policies = list(
        session.scalars(
            select(SwapPolicy)
            .where(SwapPolicy.job_id == job_id)
            .order_by(SwapPolicy.version.desc())
            .limit(MAX_POLICIES)
        )
    )
    policies.reverse()
    active = [p.version for p in policies if p.state == "applied"]
    return {
        "fingerprints": _fingerprints(session, job_id),
        "policies": [{name: getattr(p, name) for name in POLICY_FIELDS} for p in policies],
        "active": max(active) if active else None,
    }


def _fingerprints(session: Session, job_id: int) -> list[dict[str, Any]]:
    rows = list(
        session.execute(
            select(
                ShapeFingerprint.shape_fp,
                ShapeFingerprint.first_step,
                ShapeFingerprint.opseq,
                OpSequence.structure,
            )
            .outerjoin(
                OpSequence,
                and_(OpSequence.job_id == job_id, OpSequence.hash == ShapeFingerprint.opseq),
            )
            .where(ShapeFingerprint.job_id == job_id)
            .order_by(ShapeFingerprint.first_step.desc(), ShapeFingerprint.shape_fp.desc())
            .limit(MAX_FINGERPRINTS)
        ).all()
    )
    rows.reverse()
    out: list[dict[str, Any]] = []
    before: tuple[str | None, str | None] | None = None
    for shape_fp, first_step, opseq, structure in rows:
        out.append(
            {
                "shape_fp": shape_fp,
                "first_step": first_step,
                "opseq": opseq,
                "change": _change(before, (opseq, structure)),
            }
        )
        before = (opseq, structure)
    return out


def _change(
    before: tuple[str | None, str | None] | None, now: tuple[str | None, str | None]
) -> str:
    """How an op sequence (hash, structure hash) differs from the one before it."""
    if before is None:
        return "first"
    (old, old_structure), (new, new_structure) = before, now
    if old is not None and old == new:
        return "same"
    if old is None or new is None or old_structure is None or new_structure is None:
        return "unknown"
    return "shapes" if old_structure == new_structure else "structure"


def human_bytes(value: float) -> str:
    """``7.5 GiB``, ``340 MiB``: for the texts people read (three significant digits)."""
    size, unit = next(
        ((s, u) for s, u in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")) if abs(value) >= s),
        (1, "B"),
    )
    return f"{value / size:.3g} {unit}" if size > 1 else f"{value:.0f} B"


def describe(row: SwapPolicy, shape_fp: str) -> str:
    """One line on what a policy does, for the action's reason and the audit trail."""
    offload = row.policy.get("offload", [])
    moved = sum(int(o.get("bytes", 0)) for o in offload)
    n = len(offload)
    what = (
        f"offload {n} saved storage{'s' * (n != 1)} ({human_bytes(moved)})"
        if n
        else ("nothing to offload")
    )
    peak, budget = human_bytes(row.predicted_peak_bytes), human_bytes(row.budget_bytes)
    fit = (
        f"predicted peak {peak} within the {budget} budget"
        if row.feasible
        else f"predicted peak {peak} over the {budget} budget (the best plan found)"
    )
    return (
        f"swap policy v{row.version} for op sequence {row.opseq[:12]} (shape "
        f"{shape_fp[:12] or '?'}, {row.reason}): {what}; {fit}, {row.margin:.0%} of "
        f"capacity held back; {row.predicted_exposed_s:.3g} s of copies exposed per step"
    )

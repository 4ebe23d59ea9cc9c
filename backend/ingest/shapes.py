"""Keep ``shape_fingerprints``: the first step each shape fingerprint of a job ran, and the
op sequence behind it once a captured step reports both (``backend.swap.models``); and
``structure_hash``, the op-name structure of an op sequence (``opseqs.structure``).

One statement per batch whose steps carry ``shape_fp`` (or per ``/ingest/multi`` request:
its batches' fingerprints folded into one row each first), on SQLite and PostgreSQL alike::

    INSERT INTO shape_fingerprints … WITH new AS (the batch's fingerprints: earliest
        step, opseq of a captured step) SELECT … FROM new
    WHERE NOT EXISTS (a stored row as early as new, with its opseq or none to add)
    ON CONFLICT (job_id, shape_fp) DO UPDATE SET first_step = the earlier, first_rank …,
        opseq = the stored one, else new's   WHERE new is earlier OR fills the opseq

In a steady state every rank's batch carries fingerprints the job already has: the ``NOT
EXISTS`` filter drops them before the insert, so nothing is written and no row is locked
(every rank of a job shares these rows; an ``ON CONFLICT DO UPDATE`` that reached them,
even one updating nothing, would lock them until commit and serialise the job's ingest).
A new fingerprint is inserted; a lagging rank's earlier step moves ``first_step`` back
(with ``first_rank``); a captured step fills an ``opseq`` still NULL, never replaces one.
The statement is plain SQL compiled once (the batch's fingerprints go in as arrays on
PostgreSQL, as a JSON array on SQLite): a few hundred µs of server CPU per batch less than
building it with the SQL expression language every time.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from sqlalchemy import TextClause, bindparam, text
from sqlalchemy.orm import Session

from backend.db import UTCDateTime, utcnow

# The batches' fingerprints as rows (job_id, shape_fp, first_step, first_rank, opseq), per
# dialect.
_COLUMNS = ("job_id", "shape_fp", "first_step", "first_rank", "opseq")
_NEW = {
    "postgresql": "SELECT * FROM unnest(CAST(:job_id AS int[]), CAST(:shape_fp AS varchar[]), "
    "CAST(:first_step AS bigint[]), CAST(:first_rank AS int[]), CAST(:opseq AS varchar[]))",
    "sqlite": "SELECT "
    + ", ".join(f"json_extract(value, '$[{i}]')" for i in range(len(_COLUMNS)))
    + " FROM json_each(:rows)",
}
_UPSERT = """
INSERT INTO shape_fingerprints (job_id, shape_fp, first_step, first_rank, opseq, first_seen_at)
WITH new (job_id, shape_fp, first_step, first_rank, opseq) AS ({new})
SELECT new.job_id, new.shape_fp, new.first_step, new.first_rank, new.opseq, :now FROM new
WHERE NOT EXISTS (
    SELECT 1 FROM shape_fingerprints AS stored
    WHERE stored.job_id = new.job_id AND stored.shape_fp = new.shape_fp
      AND stored.first_step <= new.first_step
      AND (stored.opseq IS NOT NULL OR new.opseq IS NULL)
)
ORDER BY new.job_id, new.shape_fp
ON CONFLICT (job_id, shape_fp) DO UPDATE SET
    first_step = CASE WHEN excluded.first_step < shape_fingerprints.first_step
        THEN excluded.first_step ELSE shape_fingerprints.first_step END,
    first_rank = CASE WHEN excluded.first_step < shape_fingerprints.first_step
        THEN excluded.first_rank ELSE shape_fingerprints.first_rank END,
    opseq = COALESCE(shape_fingerprints.opseq, excluded.opseq)
WHERE excluded.first_step < shape_fingerprints.first_step
   OR (shape_fingerprints.opseq IS NULL AND excluded.opseq IS NOT NULL)
"""
_STATEMENTS: dict[str, TextClause] = {
    dialect: text(_UPSERT.format(new=new)).bindparams(bindparam("now", type_=UTCDateTime()))
    for dialect, new in _NEW.items()
}


def add_shape_fingerprints(
    *, session: Session, job_id: int, rank: int, steps: list[dict[str, Any]]
) -> int:
    """Record the fingerprints ``steps`` (one rank's step events) carry; see the module
    doc. Returns how many rows it inserted or changed (0 in a steady state)."""
    return add_many_shape_fingerprints(session=session, batches=[(job_id, rank, steps)])


def add_many_shape_fingerprints(
    *, session: Session, batches: Iterable[tuple[int, int, list[dict[str, Any]]]]
) -> int:
    """:func:`add_shape_fingerprints` for many batches, ``(job_id, rank, steps)`` in the
    order they came, in one statement: each (job, fingerprint) folded first as batch
    after batch would leave it (the earliest step and the rank of the first batch that
    had it, the first opseq)."""
    folded: dict[tuple[int, str], list[Any]] = {}  # -> [first_step, first_rank, opseq]
    for job_id, rank, steps in batches:
        for fp, (step, opseq) in _first_steps(steps).items():
            seen = folded.get((job_id, fp))
            if seen is None:
                folded[(job_id, fp)] = [step, rank, opseq]
                continue
            if step < seen[0]:
                seen[0], seen[1] = step, rank
            if seen[2] is None:
                seen[2] = opseq
    if not folded:
        return 0
    dialect = session.get_bind().dialect.name
    rows = sorted((job_id, fp, *rest) for (job_id, fp), rest in folded.items())
    params: dict[str, Any] = {"now": utcnow()}
    if dialect == "postgresql":
        params |= dict(zip(_COLUMNS, map(list, zip(*rows, strict=True)), strict=True))
    else:
        params["rows"] = json.dumps(rows)
    result = session.execute(
        _STATEMENTS[dialect], params, execution_options={"preserve_rowcount": True}
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def _first_steps(steps: list[dict[str, Any]]) -> dict[str, tuple[int, str | None]]:
    """``shape_fp`` → (its earliest step in ``steps``, the opseq of a step that carried
    both, if any)."""
    first: dict[str, tuple[int, str | None]] = {}
    for e in steps:
        fp = e.get("shape_fp")
        if fp is None:
            continue
        step, opseq = e["step"], e.get("opseq")
        seen = first.get(fp)
        if seen is None:
            first[fp] = (step, opseq)
        elif step < seen[0] or (seen[1] is None and opseq is not None):
            first[fp] = (min(step, seen[0]), seen[1] if seen[1] is not None else opseq)
    return first


def structure_hash(names: Iterable[str]) -> str:
    """An op sequence's structure (``opseqs.structure``): 16 hex of blake2b over the op
    names alone and their count, as ``collector.integrations.profile`` computes a profile's
    ``structure``; two sequences with one structure differ in shapes only.

    >>> structure_hash(["aten::mm", "aten::relu"]) == structure_hash(["aten::mm", "aten::relu"])
    True
    """
    names = list(names)
    digest = hashlib.blake2b("\n".join(names).encode("utf-8", "surrogatepass"), digest_size=8)
    digest.update(b"#%d" % len(names))
    return digest.hexdigest()

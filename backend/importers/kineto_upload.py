"""The client side of ``vigil import kineto``: read trace files, check them together, and
cut what they hold into request bodies that fit the server's body limit.

    traces = load_traces(["traces/"])                 # every *.json / *.json.gz, one a rank
    print(render(traces))                             # the per-iteration breakdown
    for body in request_bodies(traces):               # POST …/imports/kineto, in order
        ...

Why the client parses: a real trace is tens of megabytes to gigabytes of JSON (compressed
too, ten times less), past any sensible request limit; what Vigil stores of it is a few
hundred bytes an iteration. Bodies are cut at ``BUDGET_BYTES`` (half the default 8 MiB
limit) and ``MAX_EVENTS`` ingest events per rank: a rank with many iterations, or many
distinct op sequences (each up to 50,000 ops), goes in several parts, each part of each
rank one ingest batch. Every file is read and checked before anything is sent, so a bad
file stores nothing; each request is stored whole or not at all, and parts are idempotent
(their batch ids hash their content), so a run that stopped halfway can simply be repeated.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from backend.errors import Invalid
from backend.importers.kineto_schemas import KinetoImport
from backend.importers.kineto_store import check
from backend.importers.kineto_stream import KinetoError
from backend.importers.kineto_trace import RankTrace, read_trace
from backend.ingest.schemas import format_loc

BUDGET_BYTES = 4 << 20
MAX_EVENTS = 10_000
EVENTS_PER_ITERATION = 9  # a step, seven metrics, and room for the heartbeat
SUFFIXES = (".json", ".json.gz")


def trace_files(paths: Sequence[str | Path]) -> list[Path]:
    """The files named, and the ``*.json``/``*.json.gz`` files in the folders named."""
    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(SUFFIXES))
            if not found:
                raise KinetoError(f"{p}: no trace files (*.json, *.json.gz) in it")
            files += found
        elif p.exists():
            files.append(p)
        else:
            raise KinetoError(f"{p}: cannot read (no such file or directory)")
    return files


def load_traces(paths: Sequence[str | Path], rank: int | None = None) -> list[RankTrace]:
    """Every trace, read and checked together: one rank each, the same world size."""
    files = trace_files(paths)
    if rank is not None and len(files) != 1:
        raise KinetoError(f"--rank names the rank of one file; {len(files)} files given")
    traces = [read_trace(f, rank=rank) for f in files]
    by_rank: dict[int, str] = {}
    for t in traces:
        if t.rank in by_rank:
            raise KinetoError(f"{t.source}: rank {t.rank} again (also {by_rank[t.rank]})")
        by_rank[t.rank] = t.source
    sizes = {t.world_size for t in traces if t.world_size is not None}
    if len(sizes) > 1:
        raise KinetoError(f"the traces disagree on the world size: {sorted(sizes)}")
    world = job_world_size(traces)
    for t in traces:
        if t.rank >= world:
            raise KinetoError(f"{t.source}: rank {t.rank} is outside world size {world}")
    return sorted(traces, key=lambda t: t.rank)


def job_world_size(traces: Sequence[RankTrace]) -> int:
    """The traces' ``distributedInfo.world_size``, else one more than the highest rank."""
    sizes = [t.world_size for t in traces if t.world_size is not None]
    return sizes[0] if sizes else max(t.rank for t in traces) + 1


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def _fit(ops: list[Any], limit: int) -> list[Any]:
    """``ops``, cut to its first ops that take at most ``limit`` bytes of JSON (the
    fingerprint still covers them all, as the collector's does past ``MAX_OPS``)."""
    size = _size(ops)
    while size > limit and ops:
        ops = ops[: max(0, len(ops) * limit // size - 1)]
        size = _size(ops)
    return ops


def rank_parts(trace: RankTrace, *, budget: int = BUDGET_BYTES) -> list[dict[str, Any]]:
    """One rank's iterations as ``RankIn`` bodies of at most ``budget`` bytes and
    ``MAX_EVENTS`` events each (an iteration is never split); an op sequence goes with
    the first iteration that runs it."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for c in trace.collectives:
        row = {k: v for k, v in asdict(c).items() if v is not None}
        by_step.setdefault(c.step, []).append(row)
    parts: list[dict[str, Any]] = []
    part = size = events = 0
    sent: set[str] = set()
    for it in trace.iterations:
        row = {k: v for k, v in asdict(it).items() if v is not None}
        colls = by_step.get(it.step, [])
        opseqs = []
        if it.opseq is not None and it.opseq not in sent:
            sent.add(it.opseq)
            opseqs.append({"hash": it.opseq, "ops": _fit(trace.opseqs[it.opseq], budget // 2)})
        cost = _size(row) + _size(colls) + _size(opseqs)
        n = EVENTS_PER_ITERATION + len(colls) + len(opseqs)
        if not parts or size + cost > budget or events + n > MAX_EVENTS:
            name = Path(trace.source).name
            parts.append(
                {
                    "rank": trace.rank,
                    "source": name[:256],
                    "iterations": [],
                    "collectives": [],
                    "opseqs": [],
                }
            )
            part, size, events = len(parts) - 1, 1024, 1
        parts[part]["iterations"].append(row)
        parts[part]["collectives"] += colls
        parts[part]["opseqs"] += opseqs
        size, events = size + cost, events + n
    return parts


def request_bodies(
    traces: Sequence[RankTrace], *, budget: int = BUDGET_BYTES
) -> list[dict[str, Any]]:
    """``KinetoImport`` bodies for all ``traces``: parts packed up to ``budget`` bytes, a
    rank at most once a body (every rank's first part first)."""
    world = job_world_size(traces)
    per_rank = [rank_parts(t, budget=budget) for t in traces]
    ordered = [
        parts[k] for k in range(max(map(len, per_rank))) for parts in per_rank if k < len(parts)
    ]
    bodies: list[dict[str, Any]] = []
    size = 0
    for part in ordered:
        cost = _size(part)
        body = bodies[-1] if bodies else None
        if (
            body is None
            or size + cost > budget
            or any(r["rank"] == part["rank"] for r in body["ranks"])
        ):
            bodies.append({"world_size": world, "ranks": []})
            size = 64
        bodies[-1]["ranks"].append(part)
        size += cost
    return bodies


def checked_bodies(
    traces: Sequence[RankTrace], *, budget: int = BUDGET_BYTES
) -> list[dict[str, Any]]:
    """``request_bodies``, each checked as the server will check it; a value the server
    would refuse (a timestamp before 1970, a step over a week) is a ``KinetoError`` naming
    the file and the iteration, before anything is sent."""
    bodies = request_bodies(traces, budget=budget)
    for body in bodies:
        try:
            check(KinetoImport.model_validate(body))
        except ValidationError as exc:
            raise _named(body, exc.errors(include_url=False, include_input=False)[0]) from None
        except Invalid as exc:
            raise KinetoError(str(exc.detail[0]["msg"])) from None
    return bodies


def _named(body: dict[str, Any], error: Any) -> KinetoError:
    loc = tuple(error["loc"])
    part = body["ranks"][loc[1]] if len(loc) > 1 and isinstance(loc[1], int) else None
    where = part["source"] if part else "the traces"
    if part and len(loc) > 3 and loc[2] in ("iterations", "collectives"):
        rows = part[loc[2]]
        if isinstance(loc[3], int) and loc[3] < len(rows):
            where += f": step {rows[loc[3]].get('step')}"
    return KinetoError(f"{where}: {format_loc(loc[2:]) or 'body'}: {error['msg']}")


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1e3:.1f}"


COLUMNS = (
    "rank",
    "step",
    "step ms",
    "GPU span ms",
    "compute ms",
    "non-compute ms",
    "idle ms",
    "comm ms",
    "overlap %",
    "exposed comm ms",
    "op sequence",
)


def rows(traces: Iterable[RankTrace]) -> list[tuple[str, ...]]:
    """The breakdown table's rows: one per rank and iteration."""
    out: list[tuple[str, ...]] = []
    for t in traces:
        for it in t.iterations:
            g = it.gpu
            pct = g.overlap_pct if g is not None else None
            out.append(
                (
                    str(t.rank),
                    str(it.step),
                    _ms(it.duration_s),
                    _ms(g.span_s if g else None),
                    _ms(g.compute_s if g else None),
                    _ms(g.non_compute_s if g else None),
                    _ms(g.idle_s if g else None),
                    _ms(g.comm_s if g else it.comm_s),
                    "—" if pct is None else f"{pct:.2f}",
                    _ms(g.exposed_comm_s if g else it.comm_s),
                    (it.opseq or "—")[:8],
                )
            )
    return out


def render(traces: Sequence[RankTrace]) -> str:
    """What ``vigil import kineto`` prints: a line per file, then the table."""
    lines = [
        f"rank {t.rank} ({Path(t.source).name}): {len(t.iterations)} iterations, "
        f"{len(t.collectives)} collective records, {len(t.opseqs)} op sequences"
        for t in traces
    ]
    table = [COLUMNS, *rows(traces)]
    widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
    lines.append("")
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in table]
    return "\n".join(lines)

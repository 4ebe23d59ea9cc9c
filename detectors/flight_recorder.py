"""PyTorch Flight Recorder dumps: read them safely, name the ranks a hang waits for.

    dumps = [parse_dump(data, rank=r) for r, data in enumerate(blobs)]  # one dump per rank
    analyze(dumps)
    # -> [Finding(kind="hang", ranks=(9, 14), key="hang:fr:pg=72:seq=45265", ...)]
    print(render(diagnose(dumps)))

This module is the public face of three parts, all pure (bytes and values in, findings out):

- :mod:`detectors.flight_recorder_format`: the dump format. ``parse_dump`` reads one dump's
  bytes (pickle or JSON) into a ``Dump`` with a data-only unpickler: a crafted pickle raises
  ``UnsafeDumpError`` and never runs; anything unreadable raises ``FlightRecorderError`` (a
  ``ValueError``) naming the source.
- :mod:`detectors.flight_recorder_diagnosis`: ``diagnose`` matches operations across ranks per
  process group and names the culprits, the ranks where the waits end.
- here: ``analyze`` turns a diagnosis into one ``hang`` ``Finding``; ``render`` into a table.

Files are read by ``backend.importers.flight_recorder`` (``load_dump``, ``load_dumps``: one file
per rank, named ``*_<rank>``), which hands each file's bytes to ``parse_dump``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from detectors.finding import Finding
from detectors.flight_recorder_diagnosis import Diagnosis, Divergence, P2PWait, diagnose
from detectors.flight_recorder_format import (
    Dump,
    Entry,
    FlightRecorderError,
    PGStatus,
    ProcessGroup,
    UnsafeDumpError,
    decode_dump,
    parse_dump,
    read_dump,
)

__all__ = [
    "DIVERGENCE_HEAD",
    "Diagnosis",
    "Divergence",
    "Dump",
    "Entry",
    "FlightRecorderError",
    "P2PWait",
    "PGStatus",
    "ProcessGroup",
    "UnsafeDumpError",
    "analyze",
    "decode_dump",
    "diagnose",
    "divergence_rows",
    "p2p_rows",
    "parse_dump",
    "read_dump",
    "render",
]

_MAX_LINES = 20
_MAX_EVIDENCE = 100


def analyze(dumps: Iterable[Dump]) -> list[Finding]:
    """One ``hang`` finding naming the culprits, or nothing when no rank waits for another."""
    dg = diagnose(dumps)
    if not dg.culprits:
        return []
    ev: dict[str, Any] = {"source": "flight_recorder"}
    if dg.divergences:
        top = dg.divergences[0]
        ev.update(top.as_dict())
        key = f"hang:fr:pg={top.pg_name}:seq={top.seq}"
        size = _size_text(top.input_sizes)
        what = (
            f"{top.op} seq {top.seq} ({size} {'/'.join(top.input_dtypes)}) on pg "
            f"{top.pg_name} {top.pg_desc}, where {len(top.waiting)} ranks wait"
        )
        verb = "never entered"
    else:
        pw = next(w for w in dg.p2p_waits if w.peer in dg.culprits)
        key = f"hang:fr:p2p={pw.rank}->{pw.peer}"
        what = f"the {pw.kind} of rank {pw.rank} on pg {pw.pg_name} {pw.pg_desc}"
        verb = "never matched"
    word = "rank" if len(dg.culprits) == 1 else "ranks"
    summary = (
        f"{word} {', '.join(map(str, dg.culprits))} {verb} {what}; "
        f"{len(dg.held_up)} of {len(dg.ranks)} ranks are held up"
    )
    ev.update(
        {
            "culprit_reasons": {str(r): t for r, t in dg.reasons.items()},
            "process_groups": [dv.as_dict() for dv in dg.divergences[:_MAX_EVIDENCE]],
            "process_groups_total": len(dg.divergences),
            "p2p_waits": [_p2p_dict(w) for w in dg.p2p_waits[:_MAX_EVIDENCE]],
            "p2p_waits_total": len(dg.p2p_waits),
            "held_up_ranks": list(dg.held_up),
            "ranks_with_dumps": len(dg.ranks),
            "no_dump_ranks": list(dg.no_dump),
            "versions": list(dg.versions),
        }
    )
    return [
        Finding(
            kind="hang",
            severity="critical",
            ranks=dg.culprits,
            first_step=None,
            score=float(len(dg.held_up)),
            summary=summary,
            key=key,
            evidence=ev,
        )
    ]


# ---------------------------------------------------------------------------------------------
# Text


def _size_text(sizes: Iterable[Iterable[int]]) -> str:
    return ", ".join("x".join(map(str, s)) for s in sizes) or "-"


DIVERGENCE_HEAD = ("PG", "Process Group Desc", "Op", "Seq", "Size", "Dtype", "Waiting", "Missing")


def divergence_rows(groups: Iterable[Mapping[str, Any]]) -> list[tuple[str, ...]]:
    """The rows of the process-group table (``DIVERGENCE_HEAD``), one per diverging group,
    from ``Divergence.as_dict()`` values: a ``hang`` finding's evidence ``process_groups``
    holds them, so the CLI's report and the incident page show the same table. The first
    group, the collective the job waits in, is starred."""
    rows: list[tuple[str, ...]] = []
    for i, g in enumerate(groups):
        rows.append(
            (
                str(g.get("pg", "?")) + ("*" if i == 0 else ""),
                str(g.get("pg_desc", "")),
                str(g.get("op", "")),
                str(g.get("seq", "")),
                _size_text(g.get("input_sizes") or []),
                ",".join(map(str, g.get("input_dtypes") or [])) or "-",
                _span(g.get("waiting_ranks") or []),
                _span(g.get("missing_ranks") or []),
            )
        )
    return rows


def _p2p_dict(w: P2PWait) -> dict[str, Any]:
    return {"rank": w.rank, "peer": w.peer, "op": w.kind, "pg": w.pg_name, "count": w.count}


def p2p_rows(waits: Iterable[Mapping[str, Any]]) -> list[tuple[int, int, str]]:
    """Unmatched point-to-point ops as ``(rank, peer it waits for, "2 send on pg 3, …")``,
    one row per pair, from ``{"rank", "peer", "op", "pg", "count"}`` values (a finding's
    evidence ``p2p_waits``)."""
    pairs: dict[tuple[int, int], list[str]] = defaultdict(list)
    for w in waits:
        pairs[(int(w["rank"]), int(w["peer"]))].append(f"{w['count']} {w['op']} on pg {w['pg']}")
    return [(r, peer, ", ".join(ops)) for (r, peer), ops in pairs.items()]


def _span(ranks: Iterable[int]) -> str:
    """[8, 10, 11, 12, 15] -> "8,10-12,15"."""
    out: list[str] = []
    rs = sorted(ranks)
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(out) or "-"


def render(dg: Diagnosis) -> str:
    """A plain-text report: culprits, then one row per diverging process group."""
    lines = [
        f"Flight Recorder: {len(dg.ranks)} dumps (ranks {_span(dg.ranks)}), "
        f"version {', '.join(dg.versions) or '?'}"
    ]
    if not dg.culprits:
        lines.append("No rank waits for another: every pending collective has all its members.")
        return "\n".join(lines)
    lines.append(f"Culprit ranks: {', '.join(map(str, dg.culprits))}")
    reasons = list(dg.reasons.items())
    for r, text in reasons[:_MAX_LINES]:
        lines.append(f"  rank {r}: {text}")
    if len(reasons) > _MAX_LINES:
        lines.append(f"  ... and {len(reasons) - _MAX_LINES} more")
    lines.append(f"Held up: {len(dg.held_up)} ranks ({_span(dg.held_up)})")
    if dg.no_dump:
        lines.append(f"No dump from: {_span(dg.no_dump)}")
    if dg.divergences:
        rows = divergence_rows(dv.as_dict() for dv in dg.divergences[:_MAX_LINES])
        widths = [max(len(c) for c in col) for col in zip(DIVERGENCE_HEAD, *rows, strict=True)]
        lines.append("")
        for row in (DIVERGENCE_HEAD, *rows):
            lines.append(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if len(dg.divergences) > _MAX_LINES:
            lines.append(f"... and {len(dg.divergences) - _MAX_LINES} more process groups")
        lines.append("* the collective the job waits in: most ranks are blocked in it first")
    if dg.p2p_waits:
        pairs = p2p_rows(_p2p_dict(w) for w in dg.p2p_waits)
        lines.append("")
        lines.append("Unmatched point-to-point ops (rank -> peer it waits for):")
        for r, peer, ops in pairs[:_MAX_LINES]:
            lines.append(f"  {r} -> {peer}: {ops}")
        if len(pairs) > _MAX_LINES:
            lines.append(f"  ... and {len(pairs) - _MAX_LINES} more pairs")
    return "\n".join(lines)

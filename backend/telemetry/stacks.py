"""Stack dumps (the ``dump_stacks`` action's ``stacks`` events), ready to read.

    stack_dumps(session=s, job_id=7)                  # the latest dump of every rank
    stack_dumps(session=s, job_id=7, since_ts=t0, first_ranks=[1])   # an incident's

A rank answers ``dump_stacks`` with every thread's Python stack (``collector.actions``:
``traceback.format_stack`` lines, outermost first). Here each line becomes a frame (file,
line, function, code), the *training thread* is picked (``MainThread``, else the deepest
thread that is not the collector's own ``vigil-*``), and its innermost frame is marked as
the one the rank is stuck in (``hung_frame``), with the innermost frame of the user's own
code (not the standard library or site-packages) as ``user_frame``. Ranks whose training
threads stand in the same place share a ``signature``; ``groups`` lists them, smallest
group first, since in a hang the odd rank out is the one to read.

The events are free-form JSON from ranks: anything malformed is skipped or shown as text,
never trusted; sizes are capped (``MAX_THREADS``, ``MAX_FRAMES``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.telemetry.models import JobEvent

STACKS_EVENT = "stacks"
INFRA_PREFIX = "vigil-"  # the collector's own threads (worker, action runner)
MAX_DUMPS = 64  # ranks shown
MAX_THREADS = 64
MAX_FRAMES = 200
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<function>[^\n]*)')
_LIBRARY = re.compile(r"[/\\](site|dist)-packages[/\\]|[/\\]lib[/\\]python\d+(\.\d+)?[/\\]|^<")


def parse_frame(text: str) -> dict[str, Any]:
    """``'  File "t.py", line 3, in f\\n    x()'`` → ``{"file", "line", "function", "code"}``;
    a line that is not a frame keeps its text as ``code``."""
    m = _FRAME.match(text)
    if m is None:
        return {"file": None, "line": None, "function": None, "code": text.strip()[:500]}
    rest = text[m.end() :].strip()
    return {
        "file": m["file"][:500],
        "line": int(m["line"]),
        "function": m["function"].strip()[:200],
        "code": rest[:500] or None,
    }


def _is_library(frame: dict[str, Any]) -> bool:
    return frame["file"] is None or bool(_LIBRARY.search(frame["file"]))


def _threads(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    raw = attrs.get("threads")
    out = []
    for t in raw if isinstance(raw, list) else []:
        if not isinstance(t, dict) or not isinstance(t.get("stack"), list):
            continue
        lines = [s for s in t["stack"] if isinstance(s, str)][-MAX_FRAMES:]
        out.append(
            {"thread": str(t.get("thread", "?"))[:200], "frames": list(map(parse_frame, lines))}
        )
        if len(out) >= MAX_THREADS:
            break
    return out


def training_thread(threads: list[dict[str, Any]]) -> int | None:
    """Index of the thread that runs the training loop: ``MainThread`` when it has frames,
    else the deepest thread that is not the collector's own."""
    candidates = [
        (t["thread"] == "MainThread", len(t["frames"]), -i)
        for i, t in enumerate(threads)
        if t["frames"] and not t["thread"].startswith(INFRA_PREFIX)
    ]
    return -max(candidates)[2] if candidates else None


def _signature(frames: Iterable[dict[str, Any]]) -> str:
    where = "|".join(f"{f['file']}:{f['line']}:{f['function']}" for f in frames)
    return hashlib.sha1(where.encode(), usedforsecurity=False).hexdigest()[:12]


def shape_dump(row: JobEvent) -> dict[str, Any]:
    """One ``stacks`` event as the API returns it (see the module doc)."""
    attrs = row.attrs if isinstance(row.attrs, dict) else {}
    threads = _threads(attrs)
    main = training_thread(threads)
    for i, t in enumerate(threads):
        frames = t["frames"]
        t["training"] = i == main
        t["infra"] = t["thread"].startswith(INFRA_PREFIX)
        t["hung_frame"] = len(frames) - 1 if i == main and frames else None
        users = [j for j, f in enumerate(frames) if not _is_library(f)]
        t["user_frame"] = users[-1] if i == main and users else None
    # The training thread first, the collector's own threads last.
    order = sorted(
        range(len(threads)), key=lambda i: (not threads[i]["training"], threads[i]["infra"], i)
    )
    pid = attrs.get("pid")
    return {
        "rank": row.rank,
        "step": row.step,
        "ts": row.ts,
        "pid": pid if isinstance(pid, int) else None,
        "reason": str(attrs.get("reason") or "")[:500],
        "signature": _signature(threads[main]["frames"]) if main is not None else None,
        "threads": [threads[i] for i in order],
    }


def stack_dumps(
    *,
    session: Session,
    job_id: int,
    since_ts: float | None = None,
    first_ranks: Iterable[int] = (),
) -> dict[str, Any]:
    """The latest ``stacks`` event of each rank (since ``since_ts``), at most ``MAX_DUMPS``
    ranks, ``first_ranks`` (an incident's culprits) kept first; sorted by rank, with
    ``groups`` of ranks whose training threads are in the same place."""
    # Which event is each rank's latest: ids only, so the big stacks are read for the
    # MAX_DUMPS ranks shown and no others.
    query = select(JobEvent.rank, func.max(JobEvent.id)).where(
        JobEvent.job_id == job_id, JobEvent.name == STACKS_EVENT
    )
    if since_ts is not None:
        query = query.where(JobEvent.ts >= since_ts)
    latest = {int(r): int(i) for r, i in session.execute(query.group_by(JobEvent.rank))}
    wanted = set(first_ranks)
    ranks = sorted(latest, key=lambda r: (r not in wanted, r))[:MAX_DUMPS]
    rows = session.scalars(select(JobEvent).where(JobEvent.id.in_([latest[r] for r in ranks])))
    dumps = sorted((shape_dump(row) for row in rows), key=lambda d: int(d["rank"]))
    groups: dict[str, list[int]] = {}
    for d in dumps:
        if d["signature"] is not None:
            groups.setdefault(d["signature"], []).append(d["rank"])
    ordered = sorted(groups.items(), key=lambda g: (len(g[1]), g[1][0]))
    return {
        "dumps": dumps,
        "ranks_with_dumps": len(latest),
        "groups": [{"signature": sig, "ranks": rs} for sig, rs in ordered],
    }

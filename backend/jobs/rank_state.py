"""A rank's latest state: taken from a batch, upserted into ``ranks``, merged across stores.

The state has three parts, each ordered by its own clock, and **newer wins per part**, so a
late batch never overwrites fresher state:

- *step* (``last_step``, ``last_step_ts``): by the step's time;
- *beat* (``current_step``, ``last_heartbeat_ts``, ``inflight``, ``pid``, ``drops``,
  ``exited``, ``exit_code``, ``swap_capable``; ``mem_capacity`` only when the beat carries
  one: a heartbeat without it is not news of none): by the heartbeat's time;
- *meta* (``host``, ``attempt``, ``last_seen_at``): the batch that came last, by the
  server's receipt time.

A stored time further ahead of the server's clock than ``MAX_CLOCK_SKEW_S`` (a bad clock,
a hostile payload) never outranks the next real one, which would freeze the rank.

The rule is kept three times, each where it must run atomically: the SQL upsert here
(:func:`upsert_ranks`), the Redis merge script (``backend.telemetry.liveness``), and
:func:`merge`, which readers use to combine the two stores' copies (into a
:class:`RankLive`).

    values = rank_values(job_id=7, rank=3, host="node-1", attempt=0, by_type=events)
    upsert_ranks(session, [{**values, "last_seen_at": utcnow()}])
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Row, case
from sqlalchemy.orm import Session

from backend.db import insert_for
from backend.jobs.models import Rank

MAX_CLOCK_SKEW_S = 300.0

STEP_FIELDS = ("last_step", "last_step_ts")
BEAT_FIELDS = (
    "current_step",
    "last_heartbeat_ts",
    "inflight",
    "pid",
    "drops",
    "exited",
    "exit_code",
    "swap_capable",
)
META_FIELDS = ("host", "attempt", "last_seen_at")


@dataclass(frozen=True, slots=True)
class RankLive:
    """One rank's latest state as readers see it (the ``ranks`` columns that change)."""

    rank: int
    host: str | None = None
    attempt: int = 0
    last_seen_at: datetime | None = None
    last_step: int | None = None
    last_step_ts: float | None = None
    current_step: int | None = None
    last_heartbeat_ts: float | None = None
    inflight: dict[str, Any] | None = None
    pid: int | None = None
    drops: dict[str, int] | None = None
    exited: bool = False
    exit_code: int | None = None
    mem_capacity: int | None = None
    swap_capable: bool = False


_NAMES = tuple(f.name for f in dataclasses.fields(RankLive))


def row_values(row: Any) -> dict[str, Any]:
    """The state columns of a ``Rank`` row, or of a row of some of them (the rest are
    left out). Reads loaded values straight from the instance: at 16k ranks attribute
    access through the ORM costs a third of a second."""
    if isinstance(row, Row):  # some columns, from a Core select
        data = row._mapping
        return {n: data[n] for n in _NAMES if n in data}
    data = vars(row)
    return {n: data[n] if n in data else getattr(row, n) for n in _NAMES}


def rank_values(
    *, job_id: int, rank: int, host: str | None, attempt: int, by_type: dict[str, list[Any]]
) -> dict[str, Any]:
    """The state one batch tells of its rank (``last_seen_at`` is the caller's): the
    latest step and the latest heartbeat in it; a part the batch lacks is None."""
    values: dict[str, Any] = {
        "job_id": job_id,
        "rank": rank,
        "host": host,
        "attempt": attempt,  # job-wide: its run's first attempt + the batch's
        "last_step": None,
        "last_step_ts": None,
        "current_step": None,
        "last_heartbeat_ts": None,
        "inflight": None,
        "pid": None,
        "drops": None,
        "exited": False,
        "exit_code": None,
        "mem_capacity": None,
        "swap_capable": False,
    }
    if steps := by_type.get("step"):
        latest = max(steps, key=lambda e: e["ts"])
        values["last_step"], values["last_step_ts"] = latest["step"], latest["ts"]
    if beats := by_type.get("heartbeat"):
        latest = max(beats, key=lambda e: e["ts"])
        values["last_heartbeat_ts"] = latest["ts"]
        values["current_step"] = latest.get("step")
        values["inflight"] = latest.get("inflight")
        values["pid"] = latest.get("pid")
        values["drops"] = latest.get("dropped")
        values["exited"] = bool(latest.get("exiting", False))
        values["exit_code"] = latest.get("exit_code") if values["exited"] else None
        values["mem_capacity"] = latest.get("mem_capacity")
        values["swap_capable"] = bool(latest.get("swap", False))
    return values


def upsert_ranks(session: Session, rows: list[dict[str, Any]]) -> None:
    """Insert or update ``ranks`` rows (each with every column of :func:`rank_values` and
    ``last_seen_at``), newer part wins; one statement however many rows. Callers pass
    one row per (job, rank), in rank order (a fixed lock order)."""
    if not rows:
        return
    stmt = insert_for(session, Rank.__table__)
    new, cur = stmt.excluded, Rank.__table__.c
    ahead = time.time() + MAX_CLOCK_SKEW_S
    newer_step = (new.last_step_ts.is_not(None)) & (
        cur.last_step_ts.is_(None)
        | (new.last_step_ts >= cur.last_step_ts)
        | (cur.last_step_ts > ahead)
    )
    newer_beat = (new.last_heartbeat_ts.is_not(None)) & (
        cur.last_heartbeat_ts.is_(None)
        | (new.last_heartbeat_ts >= cur.last_heartbeat_ts)
        | (cur.last_heartbeat_ts > ahead)
    )
    set_: dict[str, Any] = {name: getattr(new, name) for name in META_FIELDS}
    set_ |= {n: case((newer_step, getattr(new, n)), else_=getattr(cur, n)) for n in STEP_FIELDS}
    set_ |= {n: case((newer_beat, getattr(new, n)), else_=getattr(cur, n)) for n in BEAT_FIELDS}
    set_["mem_capacity"] = case(
        (newer_beat & new.mem_capacity.is_not(None), new.mem_capacity), else_=cur.mem_capacity
    )
    stmt = stmt.on_conflict_do_update(index_elements=["job_id", "rank"], set_=set_)
    session.execute(stmt, rows)


def newer(new_ts: float | None, old_ts: float | None, *, now: float) -> bool:
    """Whether a part stamped ``new_ts`` replaces one stamped ``old_ts``."""
    if new_ts is None:
        return False
    return old_ts is None or new_ts >= old_ts or old_ts > now + MAX_CLOCK_SKEW_S


def merge(base: dict[str, Any], other: dict[str, Any], *, now: float | None = None) -> None:
    """Update ``base`` (:func:`row_values`) with the parts of ``other`` (a state of the
    same rank from another store: :func:`rank_values`' keys and ``last_seen_at``) that
    are newer."""
    now = time.time() if now is None else now
    if newer(other.get("last_step_ts"), base.get("last_step_ts"), now=now):
        base.update({n: other.get(n) for n in STEP_FIELDS})
    if newer(other.get("last_heartbeat_ts"), base.get("last_heartbeat_ts"), now=now):
        base.update({n: other.get(n) for n in BEAT_FIELDS})
        if other.get("mem_capacity") is not None:
            base["mem_capacity"] = other["mem_capacity"]
    seen, known = other.get("last_seen_at"), base.get("last_seen_at")
    if seen is not None and (known is None or seen >= known):
        base.update({n: other.get(n) for n in META_FIELDS})


def from_epoch(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)

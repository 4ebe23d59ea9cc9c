"""Liveness in Redis (distributed mode): heartbeats and in-flight ops off the SQL hot path.

Every batch carries its rank's latest state (``backend.jobs.rank_state``); at a heartbeat a
second per rank, writing it to the rank's SQL row is one row update per rank per second
(16,384 a second for a 16k-rank job) before any telemetry. In distributed mode it lands in
Redis instead: one hash per job (``vigil:live:<job id>``, one field per rank, expiring
``TTL_S`` after the job's last batch), merged there by one script call per batch, or per
``/ingest/multi`` request (newer part wins, as in SQL). The rank's SQL row is written only
when

- something people or the run's life cycle act on changed since SQL last had it: a new
  rank, its attempt or host, a goodbye (``exited``, ``exit_code``), ``mem_capacity``,
  ``swap_capable``; or
- SQL's copy is ``SQL_REFRESH_S`` old (checked at each batch, so an active rank's row is
  at most that stale: below ``backend.jobs.runs.LIVE_RANK_S``, so "live" still means
  live to the SQL readers); or
- the rank fell silent with news SQL lacks: the sweep writes its last state within
  ``QUIET_S`` (:func:`flush_quiet`, in bulk).

What SQL holds is confirmed in Redis only after the transaction commits, so a rolled-back
batch's state is written again by the next one. The hang and crash sweep and the ranks
API read both stores and merge them (:func:`overlay`); the run's life cycle, the pages and
``/metrics`` read SQL.

**Redis down.** A batch whose state Redis cannot take is written to SQL as in embedded
mode (nothing acknowledged is lost; a warning is logged once per outage, and again when
Redis is back), and Redis is not asked again for ``RETRY_S``. Readers then use SQL alone,
except the hang and crash sweep: SQL's copy may be older than the crash timeout, so it
waits until it can see every rank's latest state (:func:`blind_spot`). If Redis loses its
data, each rank's next batch writes SQL again (Redis no longer knows what SQL holds).

Embedded mode (no Redis) and ``VIGIL_LIVENESS_STORE=sql`` write every batch's state to
SQL, as before.

    record_rank(session=s, values=rank_values(...))   # ingest, in its transaction
    record_ranks(session=s, states=[...])             # /ingest/multi: one round trip
    flush_quiet(session=s, job_id=7, now=time.time())  # the sweep, before it judges
    ranks = overlay(run_ranks(session=s, job_id=7), job_id=7)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from redis import Redis
from sqlalchemy import event, select
from sqlalchemy.orm import Session

from backend.db import unique_rounds
from backend.jobs.models import Rank
from backend.jobs.rank_state import RankLive, from_epoch, merge, row_values, upsert_ranks
from backend.telemetry.liveness_store import (
    RETRY_S,
    SQL_REFRESH_S,
    LivenessStore,
    States,
    Synced,
)

__all__ = ["RETRY_S", "SQL_REFRESH_S", "LivenessStore", "States", "Synced"]

log = logging.getLogger(__name__)

QUIET_S = 3.0  # a rank silent this long has its last news flushed to SQL by the sweep
TRUST_SQL_AFTER_S = SQL_REFRESH_S + QUIET_S  # SQL alone shows a live rank this recent


def _sql_row(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if not k.startswith("_")}


# -- this process's store ----------------------------------------------------------------

_store: tuple[object, LivenessStore] | None = None


def store() -> LivenessStore | None:
    """The store of this process's runtime; None in embedded mode or with
    ``VIGIL_LIVENESS_STORE=sql``."""
    global _store
    from backend.celery_app import runtime  # the runtime's module imports the tasks

    try:
        rt = runtime()
    except Exception:  # no runtime configured (a bare library use): SQL
        return None
    url = rt.settings.redis_url
    if url is None or rt.settings.liveness_store != "redis":
        return None
    if _store is None or _store[0] is not rt:
        # Its own client, with short timeouts: ingest waits on it.
        client = Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        _store = (rt, LivenessStore(client))
    return _store[1]


# -- what ingest, the sweep and readers call ---------------------------------------------


def record_rank(*, session: Session, values: dict[str, Any], now: float | None = None) -> None:
    """Ingest: one batch's rank state (``rank_values``), in the batch's transaction."""
    record_ranks(session=session, states=[values], now=now)


def record_ranks(
    *, session: Session, states: list[dict[str, Any]], now: float | None = None
) -> None:
    """Ingest: batches' rank states (``rank_values``, in the order the batches came), in
    their transaction: one Redis round trip, and one SQL statement, however many (one
    more per repeat of a rank, so a rank's batches are applied in turn)."""
    if not states:
        return
    now = time.time() if now is None else now
    seen = from_epoch(now)
    rows = [{**values, "last_seen_at": seen} for values in states]
    live = store()
    if live is not None:
        merged = live.record_many(rows, now=now)
        if merged is not None:
            due = [row for row in merged if row is not None]
            if due:
                _upsert(session, [_sql_row(row) for row in due])
                synced = [Synced(r["job_id"], r["rank"], r["_seen"], r["_sig"]) for r in due]
                _after_commit(session, lambda: live.confirm(synced))
            return
    _upsert(session, rows)


def _upsert(session: Session, rows: list[dict[str, Any]]) -> None:
    for part in unique_rounds(rows, key=("job_id", "rank")):
        upsert_ranks(session, part)


def live_states(job_id: int) -> States | None:
    """What Redis holds of the job's ranks (``LivenessStore.states``): empty in embedded
    mode, None while Redis is unavailable. Read once, pass to :func:`flush_quiet`,
    :func:`blind_spot` and :func:`overlay`: at 16k ranks a read costs a tenth of a second."""
    live = store()
    return live.states(job_id) if live is not None else {}


def blind_spot(*, session: Session, job_id: int, states: States | None, now: float) -> str | None:
    """Why the sweep must not judge hangs and crashes now, or None when it may.

    SQL's copy of a live rank is up to ``SQL_REFRESH_S`` old, longer than the crash
    timeout (5 s), so judging from SQL alone would call every rank crashed. That happens
    (a) while Redis cannot be read, until it has been so for ``TRUST_SQL_AFTER_S`` (by
    then ingest has written every live rank's row again, as it falls back to SQL), and
    (b) when Redis lacks a rank SQL saw within ``TRUST_SQL_AFTER_S`` (Redis lost its
    data: each live rank's next batch puts it back). The sweep then leaves hangs and
    crashes as they are; a rank that is really gone is judged once it is older than that.
    """
    live = store()
    if live is None:
        return None
    if states is None:
        if live.down_for() >= TRUST_SQL_AFTER_S:
            return None
        return "Redis, where the ranks' heartbeats are, cannot be read"
    recent = from_epoch(now - TRUST_SQL_AFTER_S)
    seen = session.scalars(
        select(Rank.rank).where(
            Rank.job_id == job_id, Rank.exited.is_(False), Rank.last_seen_at >= recent
        )
    )
    missing = sum(1 for rank in seen if rank not in states)
    if missing:
        return f"{missing} ranks seen in the last {TRUST_SQL_AFTER_S:.0f} s are not in Redis"
    return None


def flush_quiet(*, session: Session, job_id: int, now: float, states: States | None = None) -> int:
    """The sweep: write to SQL, in one statement, the last state of every rank that has
    news SQL lacks and is silent for ``QUIET_S`` or last written ``SQL_REFRESH_S`` ago.
    Returns how many rows it wrote."""
    states = (live_states(job_id) or {}) if states is None else states
    live = store()
    due = [states[rank] for rank in sorted(states) if _flush_due(states[rank], now)]
    if due:
        # Only ranks SQL knows (each rank's first batch writes its row): state left in
        # Redis by a database that was since reset must not come back as ranks.
        known = set(session.scalars(select(Rank.rank).where(Rank.job_id == job_id)))
        due = [s for s in due if s["rank"] in known]
    if not due or live is None:
        return 0
    upsert_ranks(session, [_sql_row(s) for s in due])
    synced_rows = [Synced(job_id, s["rank"], s["_seen"], s["_sig"]) for s in due]
    _after_commit(session, lambda: live.confirm(synced_rows))
    return len(due)


def _flush_due(state: dict[str, Any], now: float) -> bool:
    synced: float | None = state["_synced"]
    seen: float = state["_seen"]
    if synced is None:
        return True  # SQL was never confirmed to hold it
    news = seen > synced or state["_sig"] != state["_synced_sig"]
    return news and (now - seen >= QUIET_S or now - synced >= SQL_REFRESH_S)


def overlay(
    rows: Iterable[Any], *, job_id: int, states: States | None = None, now: float | None = None
) -> list[RankLive]:
    """SQL's ``Rank`` rows, each merged with Redis's newer parts (SQL alone when Redis is
    not used or unavailable): the latest state of each rank as the two stores know it."""
    states = (live_states(job_id) or {}) if states is None else states
    now = time.time() if now is None else now
    out = []
    for row in rows:
        values = row_values(row)
        state = states.get(values["rank"])
        if state is not None:
            merge(values, state, now=now)
        out.append(RankLive(**values))
    return out


# -- after the commit --------------------------------------------------------------------

_PENDING = "vigil_liveness_confirm"


def _after_commit(session: Session, confirm: Callable[[], None]) -> None:
    """Run ``confirm`` once the session's transaction commits; drop it on a rollback
    (then SQL does not hold the state, and Redis must not think it does)."""
    pending: list[Callable[[], None]] | None = session.info.get(_PENDING)
    if pending is None:
        pending = session.info[_PENDING] = []
        event.listen(session, "after_commit", _run_pending)
        event.listen(session, "after_soft_rollback", _drop_pending)
    pending.append(confirm)


def _run_pending(session: Session) -> None:
    pending = session.info.get(_PENDING) or []
    session.info[_PENDING] = []
    for confirm in pending:
        try:
            confirm()
        except Exception:  # never fail a commit that happened
            log.exception("liveness: confirming what SQL holds failed")


def _drop_pending(session: Session, previous_transaction: Any) -> None:
    session.info[_PENDING] = []

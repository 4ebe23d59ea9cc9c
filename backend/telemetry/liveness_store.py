"""The Redis side of liveness (``backend.telemetry.liveness`` says when it is used): each
job's ranks' latest state in one hash, merged by a script per batch, read in one call.

``vigil:live:<job id>`` has one field per rank, expiring ``TTL_S`` after the job's last
batch. :meth:`LivenessStore.record` merges one batch's rank state into it (newer part
wins, as ``backend.jobs.rank_state`` says; :meth:`LivenessStore.record_many` those of many
batches, of any jobs, in one script call) and answers, in the same round trip, whether
SQL must get the merged state now: when something the run's life cycle acts on changed
since SQL was last confirmed to hold the rank (its signature: host, attempt, goodbye, exit
code, swap capability, device memory), or SQL's copy is ``SQL_REFRESH_S`` old.
:meth:`LivenessStore.confirm` records, after the commit, what SQL holds.
:meth:`LivenessStore.states` reads a whole job.

Any Redis error is logged once per outage (and again when Redis is back); the store is
then not asked again for ``RETRY_S``, and callers use SQL.

    store = LivenessStore(Redis.from_url("redis://127.0.0.1:6379/0"))
    stored, row = store.record(values, now=time.time())   # row: what SQL must get, or None
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from redis import Redis
from redis.exceptions import RedisError

from backend.jobs.rank_state import BEAT_FIELDS, MAX_CLOCK_SKEW_S, from_epoch

log = logging.getLogger(__name__)

SQL_REFRESH_S = 10.0  # an active rank's SQL row is at most this old (+ one batch)
TTL_S = 3600  # a job's hash outlives its last batch this long
RETRY_S = 5.0  # after a Redis error, SQL takes the state this long before Redis is tried

# The job's hash has one field per rank: its state's parts joined by \x1f (which JSON
# text never holds raw): meta, step_ts, step, beat_ts, beat, beat_sig, cap, sig (of what
# the state says now), synced_sig and synced (the receipt time of what SQL was last
# confirmed to hold); '' for a part not known. One field keeps the sweep's read of a 16k-rank
# job to 16k values (parsing a field per part took seconds).
_SPLIT = """
local SEP = '\\31'
local function split(s)
  local out, i = {}, 1
  while true do
    local j = string.find(s, SEP, i, true)
    if not j then out[#out + 1] = string.sub(s, i); return out end
    out[#out + 1] = string.sub(s, i, j - 1)
    i = j + 1
  end
end
"""
# KEYS: the jobs' hashes. ARGV: now, refresh_s, ahead, ttl_s, then per batch, in the
# order they came, ten values: its job's index in KEYS, rank, meta, meta_sig,
# step_ts, step, beat_ts, beat, beat_sig, cap ('' for a part the batch lacks).
# Merges each batch's parts (newer wins) and returns, per batch, what SQL must get now
# (meta, step, beat, cap, sig), or 0.
_RECORD = (
    _SPLIT
    + """
local now, refresh, ahead = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local function newer(ts, cur)
  if ts == '' then return false end
  if cur == '' then return true end
  local c = tonumber(cur)
  return tonumber(ts) >= c or c > ahead
end
local out = {}
for i = 5, #ARGV, 10 do
  local h, r = KEYS[tonumber(ARGV[i])], ARGV[i + 1]
  local old = redis.call('hget', h, r)
  local p = old and split(old) or {'', '', '', '', '', '', '', '', '', ''}
  p[1] = ARGV[i + 2]
  if newer(ARGV[i + 4], p[2]) then p[2], p[3] = ARGV[i + 4], ARGV[i + 5] end
  if newer(ARGV[i + 6], p[4]) then
    p[4], p[5], p[6] = ARGV[i + 6], ARGV[i + 7], ARGV[i + 8]
    if ARGV[i + 9] ~= '' then p[7] = ARGV[i + 9] end
  end
  p[8] = ARGV[i + 3] .. '|' .. p[6] .. '|' .. p[7]
  redis.call('hset', h, r, table.concat(p, SEP))
  if p[9] == p[8] and p[10] ~= '' and now - tonumber(p[10]) < refresh then
    out[#out + 1] = 0
  else
    out[#out + 1] = {p[1], p[3], p[5], p[7], p[8]}
  end
end
for _, h in ipairs(KEYS) do redis.call('expire', h, ARGV[4]) end
return out
"""
)
# KEYS: the jobs' hashes. ARGV: (index in KEYS, rank, seen, sig) of the states SQL now
# holds; a confirmation older than one already recorded, or for a state Redis lost, is
# ignored.
_CONFIRM = (
    _SPLIT
    + """
for i = 1, #ARGV, 4 do
  local h, r = KEYS[tonumber(ARGV[i])], ARGV[i + 1]
  local old = redis.call('hget', h, r)
  if old then
    local p = split(old)
    if p[10] == '' or tonumber(ARGV[i + 2]) >= tonumber(p[10]) then
      p[9], p[10] = ARGV[i + 3], ARGV[i + 2]
      redis.call('hset', h, r, table.concat(p, SEP))
    end
  end
end
return 1
"""
)


def job_key(job_id: int) -> str:
    return f"vigil:live:{job_id}"


@dataclass(frozen=True)
class Synced:
    """A rank state written to SQL in the current transaction, to confirm after commit."""

    job_id: int
    rank: int
    seen: float
    sig: str


States = dict[int, dict[str, Any]]


class LivenessStore:
    """The Redis side: one script call per batch (or per ``/ingest/multi`` request), one
    hash read per job and sweep."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._record = redis.register_script(_RECORD)
        self._confirm = redis.register_script(_CONFIRM)
        self._lock = threading.Lock()
        self._retry_at = 0.0
        self._down = False
        self._down_since = 0.0

    # -- availability: fall back to SQL, say so once per outage --------------------------

    def _usable(self) -> bool:
        return time.monotonic() >= self._retry_at

    def _failed(self, exc: Exception) -> None:
        with self._lock:
            self._retry_at = time.monotonic() + RETRY_S
            if not self._down:
                self._down, self._down_since = True, time.monotonic()
                log.warning(
                    "liveness: Redis unavailable (%s: %s); heartbeats and in-flight ops go "
                    "to SQL until it is back",
                    type(exc).__name__,
                    exc,
                )

    def _worked(self) -> None:
        if self._down:
            with self._lock:
                if self._down:
                    self._down = False
                    log.warning("liveness: Redis is back; heartbeats go to Redis again")

    def down_for(self) -> float:
        """Seconds since this process found Redis unavailable (0 while it works)."""
        return time.monotonic() - self._down_since if self._down else 0.0

    # -- writes --------------------------------------------------------------------------

    def record(self, values: dict[str, Any], *, now: float) -> tuple[bool, dict[str, Any] | None]:
        """Merge one batch's rank state (``rank_values`` + ``last_seen_at``) into Redis.
        Returns ``(stored, row)``: ``stored`` False when Redis could not take it (write
        ``values`` to SQL), else ``row`` is the merged state SQL must get now, or None."""
        rows = self.record_many([values], now=now)
        return (False, None) if rows is None else (True, rows[0])

    def record_many(
        self, states: list[dict[str, Any]], *, now: float
    ) -> list[dict[str, Any] | None] | None:
        """:meth:`record` for many batches' rank states, merged in the order given, in one
        script call (one round trip). Returns, per state, the merged state SQL must get
        now or None; or None when Redis could not take them (write them to SQL)."""
        if not self._usable():
            return None
        if not states:
            return []
        keys: dict[str, int] = {}
        args: list[Any] = [repr(now), SQL_REFRESH_S, repr(time.time() + MAX_CLOCK_SKEW_S), TTL_S]
        for values in states:
            beat = {n: values[n] for n in BEAT_FIELDS}
            cap = values["mem_capacity"]
            args += [
                keys.setdefault(job_key(values["job_id"]), len(keys) + 1),
                values["rank"],
                orjson.dumps([values["host"], values["attempt"], now]),
                orjson.dumps([values["host"], values["attempt"]]),
                _ts(values["last_step_ts"]),
                orjson.dumps([values["last_step"], values["last_step_ts"]]),
                _ts(values["last_heartbeat_ts"]),
                orjson.dumps(beat),
                orjson.dumps([beat["exited"], beat["exit_code"], beat["swap_capable"]]),
                "" if cap is None else str(int(cap)),
            ]
        try:
            replies = self._record(keys=list(keys), args=args)
        except RedisError as exc:
            self._failed(exc)
            return None
        self._worked()
        return [
            _merged(values, reply) if reply else None
            for values, reply in zip(states, replies, strict=True)
        ]

    def confirm(self, synced: Iterable[Synced]) -> None:
        """SQL holds these states now (its transaction committed): one script call."""
        keys: dict[str, int] = {}
        args: list[Any] = []
        for s in synced:
            index = keys.setdefault(job_key(s.job_id), len(keys) + 1)
            args += [index, s.rank, repr(s.seen), s.sig]
        if not args:
            return
        try:
            self._confirm(keys=list(keys), args=args)
        except RedisError as exc:  # the next batch or sweep writes SQL again: harmless
            self._failed(exc)

    # -- reads ---------------------------------------------------------------------------

    def states(self, job_id: int) -> States | None:
        """Every rank's state Redis holds for the job (None: Redis unavailable). Each
        has ``rank_values``' keys, ``last_seen_at``, and ``_seen``, ``_sig`` (its
        current signature), ``_synced_sig``, ``_synced`` (what SQL was confirmed to hold)."""
        if not self._usable():
            return None
        try:
            raw: dict[bytes, bytes] = self.redis.hgetall(job_key(job_id))  # type: ignore[assignment]
        except RedisError as exc:
            self._failed(exc)
            return None
        self._worked()
        out: States = {}
        for field, value in raw.items():
            p = value.split(b"\x1f")
            state = _decode(job_id, int(field), p[0], p[2], p[4], p[6])
            state["_sig"], state["_synced_sig"] = p[7].decode(), p[8].decode() or None
            state["_synced"] = float(p[9]) if p[9] else None
            out[int(field)] = state
        return out


Raw = str | bytes


def _merged(values: dict[str, Any], reply: list[Any]) -> dict[str, Any]:
    meta, step, beat_raw, cap_raw, sig = (_text(x) for x in reply)
    row = _decode(values["job_id"], values["rank"], meta, step, beat_raw, cap_raw)
    row["_sig"] = sig
    return row


def _ts(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _decode(job_id: int, rank: int, meta: Raw, step: Raw, beat: Raw, cap: Raw) -> dict[str, Any]:
    """A state as ``upsert_ranks`` and ``merge`` take it, from the hash's parts."""
    host, attempt, seen = orjson.loads(meta)
    last_step, last_step_ts = orjson.loads(step) if step else (None, None)
    beat_part = orjson.loads(beat) if beat else {n: None for n in BEAT_FIELDS}
    return {
        "job_id": job_id,
        "rank": rank,
        "host": host,
        "attempt": attempt,
        "last_seen_at": from_epoch(seen),
        "_seen": seen,
        "last_step": last_step,
        "last_step_ts": last_step_ts,
        **beat_part,
        "exited": bool(beat_part["exited"]),
        "swap_capable": bool(beat_part["swap_capable"]),
        "mem_capacity": int(cap) if cap else None,
    }

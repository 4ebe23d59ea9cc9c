"""What a load run measured: counters per report interval, the table printed per interval,
and the judgement of the incidents against the injected faults.

    stats = Stats()
    stats.ok(steps=2, collectives=6, rtt_s=0.012, delivery_s=[0.9, 1.4])
    window = stats.cut(now)                 # the interval's counters; a new one starts
    print(header(["api"])); print(format_row(row))

Two latencies: ``rtt`` is one acknowledged (200) ingest request, from sending it on a
connection to the end of the reply (a wait for a free connection of the generator's pool is
left out: each real rank has its own); ``delivery`` is
a step's end to the acknowledgement of the batch that carried it, so it includes the flush
interval, retries and ``Retry-After`` waits: what detection has to wait for.

Telemetry events are steps and collective aggregates (rows in ``steps`` and
``collectives``); heartbeats are counted apart, since they are state, not rows.
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bench.loadgen.faults import Fault, bound_s

FAULT_KINDS = ("straggler", "hang", "crash", "nan")
ONSET_SLACK_S = 1.0  # an incident detected this long before its fault is not from it


@dataclass
class Window:
    """Counters of one interval (and, in ``Stats.total``, of the whole run)."""

    start: float
    offered: int = 0  # telemetry events the ranks produced
    acked: int = 0  # telemetry events in acknowledged batches
    acked_steps: int = 0
    acked_collectives: int = 0
    heartbeats: int = 0  # heartbeats acknowledged
    requests: int = 0  # batches answered or failed (in node mode, lines of requests)
    posts: int = 0  # HTTP requests sent (node mode: one per node and flush)
    throttled: int = 0  # 429
    server_errors: int = 0  # 5xx
    transport_errors: int = 0  # refused, reset, timed out
    rejected: int = 0  # any other 4xx: the generator's bug; the batch is dropped
    drops: int = 0  # telemetry events dropped by a full rank buffer
    heartbeats_lost: int = 0  # heartbeat-only requests that failed (superseded, as the collector)
    actions: int = 0  # actions the server sent to ranks in replies
    loop_lag_s: float = 0.0  # the generator's event loop: the latest it woke up
    rtt: array[float] = field(default_factory=lambda: array("d"))
    delivery: array[float] = field(default_factory=lambda: array("d"))


class Stats:
    """Counters the senders add to; ``cut`` closes the current interval."""

    def __init__(self, now: float | None = None) -> None:
        start = time.time() if now is None else now
        self.window = Window(start)
        self.total = Window(start)
        self.rejections: list[str] = []  # the first few 4xx messages, for the summary

    def _both(self) -> tuple[Window, Window]:
        return self.window, self.total

    def offer(self, events: int) -> None:
        for w in self._both():
            w.offered += events

    def ok(
        self,
        *,
        steps: int,
        collectives: int,
        heartbeat: bool = True,
        rtt_s: float,
        delivery_s: list[float] | None = None,
        actions: int = 0,
    ) -> None:
        for w in self._both():
            w.requests += 1
            w.acked += steps + collectives
            w.acked_steps += steps
            w.acked_collectives += collectives
            w.heartbeats += int(heartbeat)
            w.actions += actions
            w.rtt.append(rtt_s)
            if delivery_s:
                w.delivery.extend(delivery_s)

    def failed(self, what: str, *, heartbeat_only: bool = False, message: str = "") -> None:
        """A request that got no 200: ``what`` is throttled, server_errors,
        transport_errors or rejected."""
        for w in self._both():
            w.requests += 1
            setattr(w, what, getattr(w, what) + 1)
            w.heartbeats_lost += int(heartbeat_only)
        if what == "rejected" and len(self.rejections) < 5:
            self.rejections.append(message[:300])

    def post(self) -> None:
        for w in self._both():
            w.posts += 1

    def drop(self, events: int) -> None:
        for w in self._both():
            w.drops += events

    def cut(self, now: float) -> Window:
        done, self.window = self.window, Window(now)
        return done


def quantile_ms(values: array[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def row(
    w: Window,
    *,
    end: float,
    t0: float,
    stored: int | None,
    cpu: dict[str, float],
    db_bytes: int | None,
) -> dict[str, Any]:
    """One interval as a dict: rates per second, latencies in ms, CPU in cores."""
    span = max(end - w.start, 1e-9)
    return {
        "t_s": round(end - t0, 1) or 0.0,  # not -0.0 for the warm-up's row
        "span_s": round(span, 1),
        "offered_per_s": round(w.offered / span, 1),
        "acked_per_s": round(w.acked / span, 1),
        "stored_per_s": None if stored is None else round(stored / span, 1),
        "requests_per_s": round(w.requests / span, 1),
        "posts_per_s": round(w.posts / span, 1),
        "heartbeats_per_s": round(w.heartbeats / span, 1),
        "rtt_p50_ms": _r(quantile_ms(w.rtt, 0.5)),
        "rtt_p99_ms": _r(quantile_ms(w.rtt, 0.99)),
        "delivery_p50_ms": _r(quantile_ms(w.delivery, 0.5)),
        "delivery_p99_ms": _r(quantile_ms(w.delivery, 0.99)),
        "throttled": w.throttled,
        "errors": w.server_errors + w.transport_errors + w.rejected,
        "drops": w.drops,
        "heartbeats_lost": w.heartbeats_lost,
        "cpu_cores": {k: round(v, 2) for k, v in cpu.items()},
        "db_mb": None if db_bytes is None else round(db_bytes / 2**20, 1),
        "loop_lag_ms": round(1000 * w.loop_lag_s),
    }


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


_COLS = [
    ("t_s", "t(s)", 6),
    ("offered_per_s", "offered/s", 10),
    ("acked_per_s", "acked/s", 10),
    ("stored_per_s", "stored/s", 10),
    ("requests_per_s", "req/s", 8),
    ("posts_per_s", "posts/s", 8),
    ("rtt_p50_ms", "p50 ms", 8),
    ("rtt_p99_ms", "p99 ms", 8),
    ("delivery_p99_ms", "dlv p99", 8),
    ("throttled", "429", 6),
    ("errors", "err", 5),
    ("drops", "drops", 6),
    ("heartbeats_lost", "hb lost", 8),
    ("db_mb", "db MB", 8),
    ("loop_lag_ms", "lag ms", 7),
]


def header(components: list[str]) -> str:
    cols = [f"{title:>{width}}" for _, title, width in _COLS]
    return " ".join(cols + [f"{c[:9]:>9}" for c in components])


def format_row(r: dict[str, Any]) -> str:
    def cell(v: Any, width: int) -> str:
        return f"{'-' if v is None else v:>{width}}"

    cols = [cell(r[key], width) for key, _, width in _COLS]
    return " ".join(cols + [cell(v, 9) for v in r["cpu_cores"].values()])


# -- incidents against faults ------------------------------------------------------------


def _ts(incident: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(incident["detected_at"]).replace("Z", "+00:00")).timestamp()


def judge(
    faults: list[Fault],
    incidents: dict[int, list[dict[str, Any]]],
    *,
    t0: float,
    step_s: float,
) -> dict[str, Any]:
    """Each fault: found (an incident of its kind naming exactly its ranks, or for a
    straggler, incidents that together name exactly them), how long after the fault's time
    it was detected, and whether within its bound. ``unexpected``: incidents of the four
    fault kinds that match no fault (wrong ranks, or nothing injected); ``other``: incidents
    of other kinds (a slowdown a straggler causes, say), for the record."""
    results: list[dict[str, Any]] = []
    used: set[int] = set()
    for f in faults:
        at = t0 + f.at_s
        mine = [
            i
            for i in incidents.get(f.job, [])
            if i["kind"] == f.kind and _ts(i) >= at - ONSET_SLACK_S and i["id"] not in used
        ]
        want = set(f.ranks)
        if f.kind == "straggler":
            match = [i for i in mine if i["ranks"] and set(i["ranks"]) <= want]
            named = set().union(*(set(i["ranks"]) for i in match)) if match else set()
            hit = match if named == want else []
        else:
            hit = [i for i in mine if set(i["ranks"]) == want][:1]
        used.update(i["id"] for i in hit)
        lag = max(_ts(i) for i in hit) - at if hit else None
        bound = bound_s(f, step_s=step_s)
        results.append(
            {
                "fault": f.describe(),
                "kind": f.kind,
                "job": f.job,
                "ranks": list(f.ranks),
                "found": bool(hit),
                "incidents": [i["id"] for i in hit],
                "lag_s": None if lag is None else round(lag, 2),
                "bound_s": bound,
                "within_bound": lag is not None and lag <= bound,
                "seen": [{"kind": i["kind"], "ranks": i["ranks"]} for i in mine][:5],
            }
        )
    unexpected: list[dict[str, Any]] = []
    other: list[dict[str, Any]] = []
    for job, rows in sorted(incidents.items()):
        for i in rows:
            brief = {
                "job": job,
                "id": i["id"],
                "kind": i["kind"],
                "ranks": i["ranks"][:20],
                "n_ranks": len(i["ranks"]),
                "detected_s": round(_ts(i) - t0, 1),  # after the run's start
            }
            if i["id"] in used:
                continue
            (unexpected if i["kind"] in FAULT_KINDS else other).append(brief)
    return {"faults": results, "unexpected": unexpected, "other": other}


def totals(stats: Stats, *, unsent_at_end: int) -> dict[str, Any]:
    """The whole run's counters, for the summary."""
    t = stats.total
    return {
        "offered": t.offered,
        "acked": t.acked,
        "acked_steps": t.acked_steps,
        "acked_collectives": t.acked_collectives,
        "heartbeats_acked": t.heartbeats,
        "requests": t.requests,
        "posts": t.posts,
        "throttled": t.throttled,
        "server_errors": t.server_errors,
        "transport_errors": t.transport_errors,
        "rejected": t.rejected,
        "rejections": stats.rejections,
        "drops": t.drops,
        "heartbeats_lost": t.heartbeats_lost,
        "unsent_at_end": unsent_at_end,
        "actions_received": t.actions,
    }


def lost(total: Window, stored: dict[str, Any]) -> dict[str, int] | None:
    """Acknowledged rows the database does not have (None without a database to ask)."""
    if not stored:
        return None
    return {
        "steps": max(0, total.acked_steps - stored["steps"]),
        "collectives": max(0, total.acked_collectives - stored["collectives"]),
    }

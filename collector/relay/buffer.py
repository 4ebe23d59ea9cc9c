"""The relay's merge buffer: rank batches waiting for the next flush, and when it is due.

Handler threads ``submit`` a rank's body and wait on its ``Entry``; the one flusher thread
``take``s what is due, sends it as one request, and ``resolve``s each entry with the
server's answer for it. Memory is bounded: past ``max_bytes`` or ``max_batches`` held,
``submit`` refuses (the handler answers 429 and the rank keeps its batch and retries).

A flush is due when the oldest batch has waited ``flush_s``; or at once when every rank
heard from in the last ``active_s`` has a batch waiting (each rank has one request in
flight at a time, so waiting longer only adds latency), or when a flush's worth
(``flush_bytes`` or ``flush_batches``) is waiting.

    buf = MergeBuffer(Limits(flush_s=1.0))
    entry = buf.submit(body, key=("job", "run", 3))    # handler thread; Full when full
    batch = buf.take(stop)                             # flusher: blocks until due
    buf.resolve(batch, answers)                        # wakes each handler

The flusher sends a flush in parts (``lane_parts``): its heartbeat-only batches first, in
requests the server's heartbeat lane takes, then the others in one request.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

from collector import lane


@dataclass(frozen=True)
class Limits:
    flush_s: float = 1.0
    max_bytes: int = 64 * 1024 * 1024  # held at most: past it, ranks get 429
    max_batches: int = 4096
    flush_bytes: int = 4 * 1024 * 1024  # one upstream request's lines, at most
    flush_batches: int = 512
    active_s: float = 5.0  # a rank not heard from this long no longer holds a flush back


@dataclass
class Answer:
    """What the rank is told: status, JSON body, and ``Retry-After`` seconds if any."""

    status: int
    body: bytes
    retry_after: float | None = None


@dataclass(eq=False)
class Entry:
    body: bytes
    key: Hashable | None  # (job, run, rank) of the batch; None when it is not JSON
    beats: bool = False  # heartbeat-only (``collector.lane``): sent apart, first
    arrived: float = field(default_factory=time.monotonic)
    state: str = "pending"  # pending → sent → done; or withdrawn
    answer: Answer | None = None
    done: threading.Event = field(default_factory=threading.Event)


def lane_parts(entries: list[Entry]) -> list[list[Entry]]:
    """A flush's upstream requests, in the order to send them: its heartbeat-only batches,
    in parts the server's heartbeat lane takes when it refuses telemetry (``collector.lane``),
    then the others, in one. So a throttled telemetry request does not take the node's
    heartbeats down with it, and their answers do not wait for it.

    >>> [[e.body for e in p] for p in lane_parts([Entry(b"t", 1), Entry(b"h", 2, True)])]
    [[b'h'], [b't']]
    """
    beats = [e for e in entries if e.beats]
    rest = [e for e in entries if not e.beats]
    out = [beats[cut] for cut in lane.parts([len(e.body) for e in beats])]
    return [*out, rest] if rest else out


class Full(Exception):
    """The buffer holds its limit; the rank is told to retry later."""


class MergeBuffer:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.flush_bytes = limits.flush_bytes  # halved when the server finds a flush too big
        self._pending: deque[Entry] = deque()
        self._pending_bytes = 0
        self._held_bytes = 0  # pending and sent, until resolved
        self._held = 0
        self._seen: dict[Hashable, float] = {}  # rank key → last arrival (monotonic)
        self._cond = threading.Condition()
        self._closing = False

    # -- handler threads -------------------------------------------------------------------

    def submit(self, body: bytes, key: Hashable | None, beats: bool = False) -> Entry:
        entry = Entry(body, key, beats)
        with self._cond:
            lim = self.limits
            if self._closing:
                raise Full("the relay is shutting down")
            if self._held >= lim.max_batches or self._held_bytes + len(body) > lim.max_bytes:
                raise Full(f"{self._held} batches, {self._held_bytes} bytes held")
            self._pending.append(entry)
            self._pending_bytes += len(body)
            self._held += 1
            self._held_bytes += len(body)
            if key is not None:
                self._seen[key] = entry.arrived
            self._cond.notify_all()
        return entry

    def withdraw(self, entry: Entry) -> bool:
        """Take back an entry not sent yet (its handler gave up waiting); False if it was."""
        with self._cond:
            if entry.state != "pending":
                return False
            self._pending.remove(entry)
            self._pending_bytes -= len(entry.body)
            self._release(entry, "withdrawn")
            return True

    # -- the flusher thread ----------------------------------------------------------------

    def take(self, stop: threading.Event) -> list[Entry]:
        """Block until a flush is due (or ``stop`` is set); the entries of that flush."""
        with self._cond:
            while not stop.is_set():
                due = self._due_in()
                if due is not None and due <= 0:
                    return self._take_locked()
                self._cond.wait(0.5 if due is None else min(due, 0.5))
            return []

    def take_all(self) -> list[Entry]:
        """A last flush at shutdown: what is pending, however little."""
        with self._cond:
            self._closing = True
            return self._take_locked() if self._pending else []

    def resolve(self, entries: list[Entry], answers: list[Answer]) -> None:
        with self._cond:
            for entry, answer in zip(entries, answers, strict=True):
                entry.answer = answer
                self._release(entry, "done")
        for entry in entries:
            entry.done.set()

    def requeue(self, entries: list[Entry]) -> None:
        """Put a flush back, in order, at the front (the server found it too big)."""
        with self._cond:
            for entry in reversed(entries):
                entry.state = "pending"
                self._pending.appendleft(entry)
                self._pending_bytes += len(entry.body)
            self.flush_bytes = max(1, self.flush_bytes // 2)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def held(self) -> tuple[int, int]:
        """Batches and bytes held (waiting or in flight)."""
        with self._cond:
            return self._held, self._held_bytes

    # -- inside the lock -------------------------------------------------------------------

    def _due_in(self) -> float | None:
        """Seconds until the next flush is due; None when nothing waits."""
        if not self._pending:
            return None
        lim, now = self.limits, time.monotonic()
        if self._closing or len(self._pending) >= lim.flush_batches:
            return 0.0
        if self._pending_bytes >= self.flush_bytes:
            return 0.0
        waiting = {e.key for e in self._pending}
        active = [k for k, at in self._seen.items() if now - at < lim.active_s]
        if len(active) < len(self._seen):  # forget ranks gone quiet
            self._seen = {k: self._seen[k] for k in active}
        if active and all(k in waiting for k in active):
            return 0.0
        return self._pending[0].arrived + lim.flush_s - now

    def _take_locked(self) -> list[Entry]:
        out: list[Entry] = []
        size = 0
        while self._pending and len(out) < self.limits.flush_batches:
            entry = self._pending[0]
            if out and size + len(entry.body) > self.flush_bytes:
                break
            self._pending.popleft()
            self._pending_bytes -= len(entry.body)
            entry.state = "sent"
            out.append(entry)
            size += len(entry.body)
        return out

    def _release(self, entry: Entry, state: str) -> None:
        if entry.state in ("pending", "sent"):
            self._held -= 1
            self._held_bytes -= len(entry.body)
        entry.state = state

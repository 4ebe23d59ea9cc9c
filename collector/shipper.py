"""Sending, for the worker thread: heartbeats apart from telemetry, and what each answer
of the server means for the batch that got it.

Every ``heartbeat_s`` the newest heartbeat goes out: with the buffered telemetry when that
flows, alone while telemetry waits (a retry, a backoff, a ``Retry-After``), so liveness and
the actions in replies never queue behind a batch. A heartbeat is also the probe: the first
one that gets through after an outage releases the telemetry at once, so delivery resumes
within about a heartbeat of the server's return (between telemetry retries the backoff is
capped at 4 s). While the worker waits for the answer to a telemetry request (a slow,
overloaded server), the heartbeats falling due go on their own from a second thread
(``collector.pulse``), so the server hears from the rank every ``heartbeat_s`` however
late it answers telemetry. After a batch fails, a heartbeat tells whether the server or
the batch is at fault; a batch the server will not take is isolated and set aside
(``collector.outbox``) and the batches behind it go on. A refused token or a wrong
endpoint (401, 403, 404) backs off from 1 s to 60 s and keeps the data.

Only the worker thread calls a ``Shipper`` (the pulse's thread only claims heartbeat ticks
and sends heartbeats); ``stats`` may read its counters from anywhere.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from collector.config import Config
from collector.outbox import STRIKES, Batch, Outbox, bad_event_indexes
from collector.pulse import Pulse
from collector.transport import Backoff, HttpTransport, Outcome

log = logging.getLogger("vigil.collector")

Event = dict[str, Any]

AUTH_BACKOFF_S = (1.0, 60.0)  # first and longest wait after a refused token
GOODBYE_RETRY_S = 0.5  # a clean-exit heartbeat is retried (within the exit timeout)
LOG_EVERY_S = 60.0  # at most one log line per kind of trouble this often
SPLITTABLE = (400, 413, 422)  # refusals a smaller batch may get past
MIN_RETRY_AFTER_S = 0.1  # a "Retry-After: 0" must not make a busy loop


class Shipper:
    def __init__(
        self,
        config: Config,
        transport: HttpTransport,
        *,
        drop: Callable[[str, int], None],
        on_actions: Callable[[list[dict[str, Any]]], None],
        tick: Callable[[], list[Event]] = list,
    ) -> None:
        self.config = config
        self.transport = transport
        self._on_actions = on_actions
        self._tick = tick  # the heartbeat(s) due now, for the pulse
        self.outbox = Outbox(limit=config.max_queue, max_batch=config.max_batch, drop=drop)
        self.sent_batches = 0
        self.sent_events = 0
        self.beat: Event | None = None  # the newest heartbeat not yet sent
        self.beat_must = False  # the clean-exit heartbeat: retried, never superseded
        self.beat_at = 0.0  # next heartbeat tick (monotonic): ``claim_beat``
        self._beat_clock = threading.Lock()  # the worker and the pulse claim ticks
        self.pulse = Pulse(due_in=lambda: self.beat_at - time.monotonic(), beat=self._beat_aside)
        self.beats_aside = 0  # heartbeats the pulse delivered (only its thread writes)
        self._beat_hold = 0.0
        self._deadline = 0.0  # when buffered telemetry is due
        self._retry_at = 0.0  # telemetry waits until then (backoff or Retry-After)
        self._throttled = False  # ``_retry_at`` is the server's Retry-After
        self._backoff = Backoff()
        self._auth_until = 0.0  # everything waits until then after a refused token
        self._auth_failures = 0
        self._logged: dict[str, float] = {}

    def add(self, event: Event) -> None:
        if not self.outbox.buf:
            self._deadline = time.monotonic() + self.config.flush_s
        self.outbox.add(event)

    def claim_beat(self, now: float) -> bool:
        """Take the heartbeat tick when it is due: the caller ticks (``tick``) and sends."""
        with self._beat_clock:
            if now < self.beat_at:
                return False
            self.beat_at = now + self.config.heartbeat_s
            return True

    def _beat_aside(self) -> None:
        """On the pulse's thread, while the worker waits for a telemetry answer: the
        heartbeat due now, alone, with its own batch id."""
        if not self.claim_beat(time.monotonic()):
            return  # the worker was back in time and took the tick
        for beat in self._tick():
            outcome = self.transport.send(self._envelope(str(uuid.uuid4()), [beat]))
            if outcome.delivered:
                self.beats_aside += 1
                self._dispatch(outcome)
            else:
                log.debug("vigil: a heartbeat sent apart was not taken (%s)", outcome.reason)

    def hold_beat(self, beat: Event) -> None:
        if self.beat_must and not beat.get("exiting"):
            return
        self.beat, self.beat_must = beat, bool(beat.get("exiting"))

    def _telemetry_due(self, flushing: bool) -> float | None:
        """When the next telemetry request may go (monotonic), or None if there is none."""
        ob = self.outbox
        if ob.batches:
            at = 0.0
        elif ob.buf:
            full = len(ob.buf) >= self.config.max_batch or flushing
            at = 0.0 if full else self._deadline
        else:
            return None
        return max(at, self._retry_at, self._auth_until)

    def wait_s(self, flushing: bool) -> float:
        due = self.beat_at
        if self.beat is not None:
            due = min(due, max(self._auth_until, self._beat_hold))
        telemetry = self._telemetry_due(flushing)
        if telemetry is not None:
            due = min(due, telemetry)
        return max(0.0, due - time.monotonic())

    def send(self, flushing: bool) -> None:
        """One heartbeat (with fresh telemetry riding along) and one telemetry request,
        each if due; the loop comes back at once when more is due."""
        ob = self.outbox
        now = time.monotonic()
        if self.beat is not None and now >= max(self._auth_until, self._beat_hold):
            beat, must, self.beat = self.beat, self.beat_must, None
            head = ob.head() if now >= self._retry_at else None
            if head is not None and head.attempts == 0:
                self._send_batch(head, beat, must)
            else:
                self._send_beat(beat, must)
        due = self._telemetry_due(flushing)
        if due is not None and time.monotonic() >= due:
            head = ob.head()
            if head is not None:
                self._send_batch(head, None, False)

    def _send_batch(self, batch: Batch, beat: Event | None, must: bool) -> None:
        events = batch.events if beat is None else [*batch.events, beat]
        batch.attempts += 1
        batch.root.requests += 1
        with self.pulse.cover():
            outcome = self.transport.send(self._envelope(batch.batch_id, events))
        if outcome.delivered or outcome.already_stored:
            self.sent_batches += 1
            self.sent_events += len(batch.events)
            self.outbox.delivered(batch)
            self._healthy()
            self._dispatch(outcome)
            return
        if beat is not None:  # it goes again alone, at once: the probe
            self.beat, self.beat_must = beat, must
        self._batch_failed(batch, outcome)

    def _send_beat(self, beat: Event, must: bool) -> None:
        outcome = self.transport.send(self._envelope(str(uuid.uuid4()), [beat]))
        if outcome.delivered:
            self.sent_batches += 1
            self._healthy()
            self._dispatch(outcome)
            return
        kind = outcome.kind
        if kind == "auth":
            self._auth_failed(outcome)
        elif kind in ("retry", "throttled"):
            self.outbox.last_error = outcome.reason
        elif kind == "refused":
            self._report("beat", "vigil: a heartbeat was refused (%s)", outcome.reason)
        head = self.outbox.batches[0] if self.outbox.batches else None
        if head is not None:
            head.suspect = False  # the server is not taking anything: not the batch's fault
        if kind == "auth" or must:
            if self.beat is None:
                self.beat, self.beat_must = beat, must
            self._beat_hold = time.monotonic() + GOODBYE_RETRY_S

    def _healthy(self) -> None:
        """The server took a request: backoffs end, and a batch that failed while it was
        up is struck (at ``STRIKES`` it is split, or set aside)."""
        self._backoff.reset()
        self._auth_until, self._beat_hold = 0.0, 0.0
        if self._auth_failures:
            log.warning("vigil: the server accepts this collector again")
            self._auth_failures = 0
        if not self._throttled:
            self._retry_at = 0.0
        ob = self.outbox
        head = ob.batches[0] if ob.batches else None
        if head is None or not head.suspect:
            return
        head.suspect = False
        head.strikes += 1
        if head.strikes >= STRIKES:
            error = f"{head.error} ({head.strikes} times while the server took other requests)"
            before = ob.set_aside_batches
            ob.split_or_set_aside(head, "failed", error)
            if ob.set_aside_batches > before:
                self._set_aside_logged(len(head.events), error)

    def _batch_failed(self, batch: Batch, outcome: Outcome) -> None:
        now = time.monotonic()
        kind = outcome.kind
        batch.error = outcome.reason
        if kind == "retry":
            # A batch whose request went unanswered may be stored: never struck (and so
            # never split into halves with new ids, which would store its events twice);
            # an overloaded server answers it, or the duplicate, on a later try.
            batch.suspect = not outcome.unanswered
            self._retry_at, self._throttled = now + self._backoff.next_delay(), False
            with self._beat_clock:  # a heartbeat now tells the server's fault from the batch's
                self.beat_at = now
            self.outbox.last_error = outcome.reason
            self._report("retry", "vigil: backend not taking data (%s); retrying", outcome.reason)
        elif kind == "throttled":
            wait = max(MIN_RETRY_AFTER_S, float(outcome.retry_after or 0))
            self._retry_at, self._throttled = now + wait, True
        elif kind == "auth":
            self._auth_failed(outcome)
        else:
            self._refused(batch, outcome)

    def _refused(self, batch: Batch, outcome: Outcome) -> None:
        """A 4xx (or an event JSON cannot encode): never sent again as it was."""
        ob, n, error = self.outbox, len(batch.events), outcome.reason
        if error == "unencodable":
            bad = {i for i, e in enumerate(batch.events) if not _encodable(e)}
            ob.drop_events(batch, bad or set(range(n)), "unencodable", "not JSON-encodable")
            self._set_aside_logged(len(bad) or n, "events not JSON-encodable")
            return
        indexes, other = bad_event_indexes(outcome.detail)
        named = {i for i in indexes if i < n}  # index n: the heartbeat riding along
        if indexes and not named and not other:
            return  # only that heartbeat was named: the batch goes again as it is
        if named and not other and batch.root.requests < batch.root.budget:
            ob.drop_events(batch, named, "rejected", error)
            self._set_aside_logged(len(named), error)
            return
        before = ob.set_aside_batches
        if other or outcome.status not in SPLITTABLE:
            ob.set_aside(batch, "rejected", error)
        else:
            ob.split_or_set_aside(batch, "rejected", error)
        if ob.set_aside_batches > before:
            self._set_aside_logged(n, error)

    def _auth_failed(self, outcome: Outcome) -> None:
        self._auth_failures += 1
        first, longest = AUTH_BACKOFF_S
        delay = min(longest, first * 2 ** (self._auth_failures - 1)) * random.uniform(0.8, 1.2)
        self._auth_until = time.monotonic() + delay
        self.outbox.last_error = outcome.reason
        self._report(
            "auth",
            "vigil: the server refused this collector (%s): check VIGIL_TOKEN and "
            "VIGIL_ENDPOINT. Data is kept (the oldest goes when the buffer is full) and "
            "sent again in %.0f s.",
            outcome.reason,
            delay,
        )

    def _set_aside_logged(self, n: int, error: str) -> None:
        self._report(
            "set_aside",
            "vigil: set aside %d event(s) the server will not take (%s); the rest goes on. "
            "Totals: vigil.stats()",
            n,
            error,
        )

    def _report(self, topic: str, message: str, *args: Any) -> None:
        """Log a kind of trouble once per ``LOG_EVERY_S``; the rest at debug level."""
        now = time.monotonic()
        last = self._logged.get(topic)
        if last is None or now - last >= LOG_EVERY_S:
            self._logged[topic] = now
            log.warning(message, *args)
        else:
            log.debug(message, *args)

    def _envelope(self, batch_id: str, events: list[Event]) -> dict[str, Any]:
        c = self.config
        body = {
            "batch_id": batch_id,
            "job": c.job,
            "kind": c.kind,
            "rank": c.rank,
            "world_size": c.world_size,
            "host": c.host,
            "attempt": c.attempt,
            "events": events,
        }
        if c.run:
            body["run"] = c.run  # this launch: a new one is a new run of the job
        return body

    def _dispatch(self, outcome: Outcome) -> None:
        if outcome.actions:
            try:
                self._on_actions(outcome.actions)
            except Exception:
                log.warning("vigil: could not dispatch actions", exc_info=True)


def _encodable(event: Event) -> bool:
    try:
        json.dumps(event, separators=(",", ":"))
    except (TypeError, ValueError):
        return False
    return True

"""What the worker holds for the backend: telemetry waiting to be batched, and batches
waiting to be delivered. Bounded; when full, the *oldest* telemetry goes.

Only the worker thread touches an ``Outbox``.

**The drop policy.** At most ``limit`` events (``VIGIL_MAX_QUEUE``) are held. When an outage
fills that, the oldest are dropped first (counted as ``buffer_full``), so what reaches the
server when it comes back is the recent past, the part the detectors need. Heartbeats are
not held here: the worker keeps only the newest one and sends it on its own schedule.

**A batch the server will not take** is never retried as it was:

- a ``4xx`` that names events (``detail[].field`` = ``events[7].name``) loses those events
  only (``rejected``); the rest is sent again at once;
- a ``4xx`` naming nothing, a ``413``, or a batch that failed ``STRIKES`` times while the
  server took other requests (``5xx``, reset connection, timeout: the batch, not the server)
  is split in halves, each sent on its own, down to the single event, which is set aside
  (``rejected`` or ``failed``). A budget per original batch bounds the extra requests; past
  it a failing piece is set aside whole.

Every piece set aside counts one in ``set_aside_batches`` and its reason is kept as
``last_error``. Nothing set aside is kept in memory.
"""

from __future__ import annotations

import math
import re
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Event = dict[str, Any]

STRIKES = 2  # failures while the server took other requests before a batch is split
_FIELD = re.compile(r"(?:^|\b)events\[(\d+)\]")


@dataclass
class _Root:
    """The batch a piece was split from: bounds how many requests isolating costs."""

    size: int
    requests: int = 0

    @property
    def budget(self) -> int:
        return 8 + 6 * math.ceil(math.log2(self.size + 1))


@dataclass
class Batch:
    events: list[Event]
    root: _Root
    batch_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    attempts: int = 0
    strikes: int = 0
    suspect: bool = False  # failed; a heartbeat will tell whether the server is up
    error: str = ""  # why the last attempt failed


class Outbox:
    def __init__(self, *, limit: int, max_batch: int, drop: Callable[[str, int], None]) -> None:
        self.limit = limit
        self.max_batch = max_batch
        self._drop = drop
        self.buf: deque[Event] = deque()
        self.batches: deque[Batch] = deque()
        self.held = 0  # events in ``buf`` and ``batches``
        self.taken = 0  # events ever added to ``buf``
        self.buf_out = 0  # events ever removed from the front of ``buf``
        self.set_aside_batches = 0
        self.last_error: str | None = None

    # -- filling ---------------------------------------------------------------------------

    def add(self, event: Event) -> None:
        self.buf.append(event)
        self.taken += 1
        self.held += 1

    def trim(self) -> int:
        """Drop the oldest events beyond ``limit``; returns how many went."""
        excess = self.held - self.limit
        if excess <= 0:
            return 0
        left = excess
        while left and self.batches:
            head = self.batches[0]
            # A prefix cut keeps the batch id: the server stored none of it, or all of
            # it (a lost reply), and then answers the smaller retry as a duplicate.
            cut = min(left, len(head.events))
            del head.events[:cut]
            left -= cut
            if not head.events:
                self.batches.popleft()
        cut = min(left, len(self.buf))
        for _ in range(cut):
            self.buf.popleft()
        self.buf_out += cut
        self.held -= excess
        self._drop("buffer_full", excess)
        return excess

    # -- batches ---------------------------------------------------------------------------

    def head(self) -> Batch | None:
        """The batch to send next: a piece in retry, else a new one from the buffer."""
        if not self.batches and self.buf:
            n = min(len(self.buf), self.max_batch)
            events = [self.buf.popleft() for _ in range(n)]
            self.buf_out += n
            self.batches.append(Batch(events, _Root(n)))
        return self.batches[0] if self.batches else None

    def delivered(self, batch: Batch) -> None:
        self._remove(batch)

    def set_aside(self, batch: Batch, reason: str, error: str) -> None:
        """Give up on ``batch``: counted under ``reason``, never sent again."""
        self._remove(batch)
        self._drop(reason, len(batch.events))
        self.set_aside_batches += 1
        self.last_error = error

    def drop_events(self, batch: Batch, indexes: set[int], reason: str, error: str) -> None:
        """Set aside the events of ``batch`` at ``indexes``; the rest stays at the front."""
        keep = [e for i, e in enumerate(batch.events) if i not in indexes]
        gone = len(batch.events) - len(keep)
        batch.events = keep
        self.held -= gone
        self._drop(reason, gone)
        self.set_aside_batches += 1
        self.last_error = error
        batch.strikes = 0
        if not keep:
            self.batches.remove(batch)

    def split_or_set_aside(self, batch: Batch, reason: str, error: str) -> None:
        """Halve a failing batch (each half tried on its own), or set it aside when it is a
        single event or its original batch spent its request budget."""
        if len(batch.events) < 2 or batch.root.requests >= batch.root.budget:
            self.set_aside(batch, reason, error)
            return
        mid = len(batch.events) // 2
        index = self.batches.index(batch)
        self.batches[index] = Batch(batch.events[:mid], batch.root)
        self.batches.insert(index + 1, Batch(batch.events[mid:], batch.root))

    def _remove(self, batch: Batch) -> None:
        if self.batches and self.batches[0] is batch:
            self.batches.popleft()
        else:
            self.batches.remove(batch)
        self.held -= len(batch.events)

    # -- questions -------------------------------------------------------------------------

    def settled(self, mark: int) -> bool:
        """Whether every event taken before ``taken`` was ``mark`` is delivered or dropped."""
        return self.buf_out >= mark and not self.batches

    def clear(self) -> int:
        n = self.held
        self.buf.clear()
        self.batches.clear()
        self.held = 0
        return n


def bad_event_indexes(detail: Any) -> tuple[set[int], bool]:
    """The event indexes an error body names, and whether it named anything else too.

    ``detail`` is the body's ``detail``: a list of ``{"field": "events[3].name", …}`` (or
    pydantic's ``loc``), or a string that mentions ``events[3]``.
    """
    indexes: set[int] = set()
    other = False
    items = detail if isinstance(detail, list) else [detail]
    for item in items:
        found: list[int] = []
        if isinstance(item, dict):
            name = item.get("field")
            loc = item.get("loc")
            if isinstance(name, str):
                found = [int(m) for m in _FIELD.findall(name)[:1]]
                other = other or (not found and name not in ("", "body"))
            elif isinstance(loc, list):
                found = [
                    loc[i + 1]
                    for i in range(len(loc) - 1)
                    if loc[i] == "events" and isinstance(loc[i + 1], int)
                ][:1]
                other = other or not found
        elif isinstance(item, str):
            found = [int(m) for m in _FIELD.findall(item)]
        indexes.update(found)
    return indexes, other

"""Faults for the example model server, like training's ``VIGIL_CHAOS``.

    VIGIL_SERVE_CHAOS="slow:factor=3,after_s=20;stall:at_s=30,for_s=5"
    python -m examples.serving.model_server --chaos "errors:rate=0.3,after_s=10,for_s=10"

| fault | effect |
|---|---|
| ``slow:factor=F`` | every engine step takes F times as long (a sleep of (F-1)× its duration) |
| ``stall:at_s=T,for_s=D`` | the engine stops stepping for D seconds at T (streams freeze) |
| ``errors:rate=R`` | a fraction R of new requests is answered ``500`` |
| ``shed:max_waiting=N`` | a new request is answered ``429`` while N or more wait for a slot |

Every fault takes ``after_s`` (default 0) and ``for_s`` (default: for ever), seconds since the
server started, as the window it acts in (``at_s`` is ``after_s``). Faults are separated by
``;``. A spec that does not parse stops the server at start, with a message.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

KINDS = {
    "slow": {"factor"},
    "stall": set(),
    "errors": {"rate", "seed"},
    "shed": {"max_waiting"},
}
WINDOW = {"after_s", "at_s", "for_s"}


class ChaosSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    kind: str
    after_s: float
    for_s: float
    params: dict[str, float]

    def active(self, elapsed: float) -> bool:
        return self.after_s <= elapsed < self.after_s + self.for_s


def parse(spec: str) -> list[Fault]:
    """``"slow:factor=3,after_s=20;shed:max_waiting=8"`` → faults.

    >>> [(f.kind, f.after_s, f.params) for f in parse("slow:factor=3,after_s=20")]
    [('slow', 20.0, {'factor': 3.0})]
    """
    faults = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        kind, _, rest = part.partition(":")
        kind = kind.strip()
        if kind not in KINDS:
            raise ChaosSpecError(f"unknown fault {kind!r} (known: {', '.join(KINDS)})")
        params: dict[str, float] = {}
        for item in filter(None, (i.strip() for i in rest.split(","))):
            name, eq, raw = item.partition("=")
            name = name.strip()
            if not eq or name not in KINDS[kind] | WINDOW:
                allowed = ", ".join(sorted(KINDS[kind] | WINDOW))
                raise ChaosSpecError(f"{kind}: bad parameter {item!r} (allowed: {allowed})")
            try:
                params[name] = float(raw)
            except ValueError:
                raise ChaosSpecError(f"{kind}: {name} must be a number, not {raw!r}") from None
        after = params.pop("after_s", params.pop("at_s", 0.0))
        duration = params.pop("for_s", math.inf)
        if kind == "stall" and math.isinf(duration):
            raise ChaosSpecError("stall: for_s is required")
        faults.append(Fault(kind, after, duration, params))
    return faults


class Chaos:
    """The faults of one server, timed from its start."""

    def __init__(self, faults: list[Fault], *, clock: Callable[[], float] = time.monotonic) -> None:
        self.faults = faults
        self._clock = clock
        self._t0 = clock()
        errors = [f for f in faults if f.kind == "errors"]
        seed = int(errors[0].params.get("seed", 0)) if errors else 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    @classmethod
    def from_spec(cls, spec: str) -> Chaos:
        return cls(parse(spec))

    def __bool__(self) -> bool:
        return bool(self.faults)

    def elapsed(self) -> float:
        return self._clock() - self._t0

    def _active(self, kind: str) -> list[Fault]:
        now = self.elapsed()
        return [f for f in self.faults if f.kind == kind and f.active(now)]

    # -- the HTTP side: called for each new request ----------------------------------------

    def reject(self, waiting: int) -> int | None:
        """The status a new request gets instead of being served, or None."""
        for f in self._active("shed"):
            if waiting >= f.params.get("max_waiting", 0):
                return 429
        for f in self._active("errors"):
            with self._lock:
                draw = self._rng.random()
            if draw < f.params.get("rate", 1.0):
                return 500
        return None

    # -- the engine side: called around each step -----------------------------------------

    def before_step(self) -> None:
        now = self.elapsed()
        for f in self.faults:
            if f.kind == "stall" and f.active(now):
                time.sleep(f.after_s + f.for_s - now)

    def after_step(self, took_s: float) -> None:
        factor = max((f.params.get("factor", 1.0) for f in self._active("slow")), default=1.0)
        if factor > 1:
            time.sleep(took_s * (factor - 1))

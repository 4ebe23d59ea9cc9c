"""Fault injection for tests and the demo, off unless ``VIGIL_CHAOS`` is set.

    VIGIL_CHAOS="straggler:rank=2,from_step=50,delay_s=0.2;hang:rank=1,at_step=120;\\
crash:rank=3,at_step=200;nan:at_step=300;slow_collective:rank=0,factor=4"

Faults act in the real job: a straggler sleeps inside its steps, a hung rank stops before
its next step (so it never enters the collective its peers wait in), a crash is
``os._exit``, NaN poisons the gradients so the next loss is really NaN, a slow collective
really takes ``factor`` times longer. A fault without ``rank`` applies to every rank;
faults fire on restart attempt 0 only, unless ``attempt=N`` or ``attempt=*`` says otherwise,
so a restarted job can recover.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

log = logging.getLogger("vigil.collector")

KINDS = ("straggler", "hang", "crash", "nan", "slow_collective")


class ChaosSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    kind: str
    params: dict[str, str] = field(default_factory=dict)

    def num(self, name: str, default: float) -> float:
        try:
            return float(self.params.get(name, default))
        except ValueError:
            raise ChaosSpecError(f"{self.kind}: {name} must be a number") from None

    def applies(self, rank: int, attempt: int) -> bool:
        ranks = self.params.get("rank")
        if ranks is not None and str(rank) not in ranks.split("|"):
            return False
        wanted = self.params.get("attempt", "0")
        return wanted == "*" or wanted == str(attempt)


class Chaos:
    def __init__(self, faults: list[Fault], rank: int) -> None:
        self.faults = faults
        self.rank = rank

    @classmethod
    def parse(cls, spec: str, *, rank: int, attempt: int | None = None) -> Chaos:
        """Parse a spec; an invalid one is logged and ignored (it must not kill the job)."""
        if attempt is None:
            attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        try:
            faults = [f for f in parse_spec(spec) if f.applies(rank, attempt)]
        except ChaosSpecError as exc:
            log.error("vigil: ignoring VIGIL_CHAOS: %s", exc)
            faults = []
        if faults:
            log.warning("vigil: chaos on rank %d: %s", rank, faults)
        return cls(faults, rank)

    def __bool__(self) -> bool:
        return bool(self.faults)

    def at_step_start(self, step: int) -> None:
        for f in self.faults:
            if f.kind == "hang" and step == f.num("at_step", -1):
                log.warning("vigil chaos: rank %d hangs at step %d", self.rank, step)
                while True:  # never enter the next collective
                    time.sleep(3600)
            if f.kind == "crash" and step == f.num("at_step", -1):
                log.warning("vigil chaos: rank %d crashes at step %d", self.rank, step)
                os._exit(int(f.num("exit_code", 1)))

    def at_step_end(self, step: int) -> None:
        for f in self.faults:
            if f.kind == "straggler" and f.num("from_step", 0) <= step < f.num("to_step", 1e18):
                time.sleep(f.num("delay_s", 0.2))

    def poison_gradients(self, step: int | None) -> bool:
        """True when gradients should be made NaN before this step's optimizer update."""
        if step is None:
            return False
        return any(f.kind == "nan" and step == f.num("at_step", -1) for f in self.faults)

    def collective_delay(self, duration_s: float) -> float:
        """Sleep so the collective takes ``factor`` times as long; returns the extra time."""
        extra = 0.0
        for f in self.faults:
            if f.kind == "slow_collective":
                extra += max(0.0, (f.num("factor", 4) - 1) * duration_s)
        if extra > 0:
            time.sleep(extra)
        return extra


def parse_spec(spec: str) -> list[Fault]:
    faults = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        kind, _, args = part.partition(":")
        kind = kind.strip()
        if kind not in KINDS:
            raise ChaosSpecError(f"unknown fault {kind!r}; known: {', '.join(KINDS)}")
        params = {}
        for pair in filter(None, (a.strip() for a in args.split(","))):
            key, sep, value = pair.partition("=")
            if not sep:
                raise ChaosSpecError(f"{kind}: expected key=value, got {pair!r}")
            params[key.strip()] = value.strip()
        faults.append(Fault(kind, params))
    return faults

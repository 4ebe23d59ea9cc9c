"""Faults on a schedule, and the bound within which each must be found.

    >>> faults = parse_faults("straggler@20s:rank=7:factor=1.5,hang@40s:rank=100,"
    ...                       "crash@1m:rank=8-11:job=1")
    >>> [(f.kind, f.at_s, f.ranks, f.job) for f in faults]
    [('straggler', 20.0, (7,), 0), ('hang', 40.0, (100,), 0), ('crash', 60.0, (8, 9, 10, 11), 1)]
    >>> bound_s(faults[1], step_s=1.0)
    20.0

Grammar: faults separated by commas, each ``KIND@TIME[:key=value]...``. ``TIME`` is seconds
from the start of the run (``20``, ``20s``, ``1.5m``). Keys: ``rank`` (``7``, ``7+9``, a
range ``8-15``; required), ``factor`` (a straggler's compute factor, default 1.5; at least
1.1, since the detector ignores less than 10%), ``job`` (which simulated job, from 0).

Kinds and what they do (``bench.loadgen.job`` has the detail): ``straggler`` (the ranks
compute ``factor``× longer from the next step), ``hang`` (the ranks stop stepping, their
heartbeats go on in no collective; the job stops), ``crash`` (the ranks send nothing more;
the job stops), ``nan`` (loss and grad norm NaN on the ranks from the next step, on every
rank after it).

The bounds are issue 16's: a straggler within 10 s of its onset, a hang within
max(5 × step, 10 s) + 10 s, a crash within 15 s. The issue gives none for a NaN; 10 s is
ours (one flush and one detection run, with slack).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KINDS = ("straggler", "hang", "crash", "nan")
_FAULT = re.compile(r"^(?P<kind>[a-z]+)@(?P<at>\d+(?:\.\d+)?)(?P<unit>[sm]?)(?P<opts>(?::[^:]+)*)$")
_START = re.compile(r",(?=[a-z]+@)")  # a comma that starts the next fault (not one in a value)


@dataclass(frozen=True)
class Fault:
    kind: str
    at_s: float  # seconds after the run's start
    ranks: tuple[int, ...]
    factor: float = 1.5
    job: int = 0

    def describe(self) -> str:
        extra = f" ×{self.factor:g}" if self.kind == "straggler" else ""
        return f"{self.kind}@{self.at_s:g}s ranks {list(self.ranks)}{extra} (job {self.job})"


class FaultSpecError(ValueError):
    """A ``--faults`` value that cannot be read; the message names the part."""


def parse_faults(spec: str) -> list[Fault]:
    """Every fault in ``spec`` (empty: none), in the order given."""
    spec = spec.strip()
    if not spec:
        return []
    return [_parse_one(part.strip()) for part in _START.split(spec)]


def _parse_one(text: str) -> Fault:
    m = _FAULT.match(text)
    if m is None:
        raise FaultSpecError(
            f"fault {text!r}: expected KIND@TIME[:key=value...], e.g. hang@40s:rank=3"
        )
    kind = m["kind"]
    if kind not in KINDS:
        raise FaultSpecError(f"fault {text!r}: kind must be one of {', '.join(KINDS)}")
    at = float(m["at"]) * (60 if m["unit"] == "m" else 1)
    opts: dict[str, str] = {}
    for item in filter(None, m["opts"].split(":")):
        key, sep, value = item.partition("=")
        if not sep or not value or key not in ("rank", "ranks", "factor", "job"):
            raise FaultSpecError(f"fault {text!r}: unknown option {item!r} (rank, factor, job)")
        opts["rank" if key == "ranks" else key] = value
    if "rank" not in opts:
        raise FaultSpecError(f"fault {text!r}: needs rank=N (or N+M, or a range N-M)")
    try:
        ranks = _ranks(opts["rank"])
        factor = float(opts.get("factor", 1.5))
        job = int(opts.get("job", 0))
    except ValueError:
        raise FaultSpecError(f"fault {text!r}: rank, factor and job must be numbers") from None
    if kind == "straggler" and not 1.1 <= factor <= 100:
        raise FaultSpecError(f"fault {text!r}: factor must be in [1.1, 100]")
    if job < 0:
        raise FaultSpecError(f"fault {text!r}: job must be ≥ 0")
    return Fault(kind=kind, at_s=at, ranks=ranks, factor=factor, job=job)


def _ranks(value: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in value.split("+"):
        lo, dash, hi = part.partition("-")
        out += range(int(lo), int(hi) + 1) if dash else [int(lo)]
    if not out or min(out) < 0:
        raise ValueError(value)
    return tuple(sorted(set(out)))


def check_faults(faults: list[Fault], *, ranks: int, jobs: int) -> None:
    """Refuse faults that name a rank or job the run does not have."""
    for f in faults:
        if f.job >= jobs:
            raise FaultSpecError(f"{f.describe()}: the run has {jobs} job(s)")
        if max(f.ranks) >= ranks:
            raise FaultSpecError(f"{f.describe()}: the jobs have {ranks} ranks")
        if len(f.ranks) >= ranks:
            raise FaultSpecError(f"{f.describe()}: a fault must leave some ranks healthy")


def bound_s(fault: Fault, *, step_s: float) -> float:
    """Seconds from the fault's time within which its incident must be detected."""
    if fault.kind == "hang":
        return max(5 * step_s, 10.0) + 10.0
    return {"straggler": 10.0, "crash": 15.0, "nan": 10.0}[fault.kind]

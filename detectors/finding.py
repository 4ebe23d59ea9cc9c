"""The one result type every detector returns.

    Finding(kind="straggler", severity="warning", ranks=(6,), first_step=1810, score=7.5,
            summary="rank 6 computes 2.1x slower than the median rank since step 1810",
            evidence={"median_compute_s": 0.43, "rank_compute_s": 0.91},
            key="straggler:6")

A detector reports the conditions it sees in the window it was given. ``key`` identifies
"the same problem" within a job (the backend turns it into an incident fingerprint, so a
condition seen again updates its incident instead of opening a new one). ``active=False``
means the condition was present in the window but has cleared (a transient straggler that
recovered); the backend then resolves the incident. ``evidence["partial_view"]`` (a reason,
for people) says the window shows only part of the condition — a NaN whose onset slid out
of the window, a hang whose ranks are leaving — so the backend keeps an open incident's
ranks and summary as they were and takes only whether it still holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["info", "warning", "critical"]
KINDS = (
    "straggler",
    "hang",
    "crash",
    "nan",
    "loss_spike",
    "slowdown",
    "comm_anomaly",
    "opseq_change",
    "memory_pressure",
    "slo_burn",
    "slow_replica",
    "queue_buildup",
)


@dataclass(frozen=True)
class Finding:
    kind: str
    severity: Severity
    ranks: tuple[int, ...]
    first_step: int | None
    score: float
    summary: str
    key: str
    evidence: dict[str, Any] = field(default_factory=dict)
    active: bool = True
    last_step: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown finding kind {self.kind!r}")

"""A detector's evidence as a person reads it: labels in words, values with their units.

    evidence_rows({"median_compute_s": 0.43, "rise_pct": 31.5, "ranks_affected": 4})
    # [EvidenceRow(label="median compute time", value="0.43 s", key="median_compute_s"),
    #  EvidenceRow(label="step time rise", value="31.5 %", key="rise_pct"),
    #  EvidenceRow(label="ranks affected", value="4", key="ranks_affected")]

Detectors keep their keys short and in snake_case (they are an API: the JSON of an incident
keeps them); the page shows ``label`` and ``value`` and keeps the raw ``key`` as a tooltip.
Units come from the key's suffix (``_s`` seconds, ``_pct`` percent, ``_gbps`` GB/s, ``_gib``,
``_bytes``, ``_x`` times …), words from ``LABELS`` where the plain words would mislead,
else the key with its underscores as spaces. Nested dicts become ``parent › child`` rows;
a list of dicts (e.g. a comm incident's slow groups) one row group per item.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from backend.telemetry.untimed import untimed_collectives
from detectors.flight_recorder import DIVERGENCE_HEAD, divergence_rows, p2p_rows
from detectors.policy import human_seconds

# Keys whose plain words would mislead or hide the unit; the rest read well as words.
LABELS = {
    "median_compute_s": "median compute time",
    "reference_compute_s": "reference compute time (fast ranks)",
    "rank_compute_s": "compute time of the named rank",
    "ratio": "slower than the reference",
    "baseline_ratio": "usual ratio (baseline)",
    "ratio_vs_baseline": "slower than its usual ratio",
    "threshold_ratio": "threshold",
    "basis": "compared on",
    "rise_pct": "step time rise",
    "drop_pct": "bandwidth drop",
    "before_step_s": "step time before",
    "after_step_s": "step time after",
    "slow_for_s": "time spent slow",
    "stalled_s": "no step finished for",
    "waiting_s": "waiting for",
    "timeout_s": "step timeout",
    "heartbeat_timeout_s": "heartbeat timeout",
    "silent_s": "silent for",
    "slowest_step_s": "slowest recent step",
    "n_steps": "steps the timeout was learned from",
    "z": "robust z-score",
    "threshold_z": "z-score threshold",
    "ewma_before": "loss average (EWMA) before",
    "robust_sigma": "robust σ of the loss",
    "slower_x": "slower than its peers",
    "usage_pct": "memory used",
    "slope_mib_per_step": "memory growth",
    "pg": "process group",
    "pg_desc": "process group description",
    "seq": "sequence number",
    "entered_ns": "first waiter entered at (ns)",
    "consequence_of": "consequence of incident",
    "reopened": "times re-opened",
}
# Keys whose numbers carry no unit even if the name ends like one.
_PLAIN = {"basis", "component", "family", "group", "source", "timeout_source", "note"}


@dataclass(frozen=True)
class EvidenceRow:
    label: str
    value: str
    key: str  # the detector's own key path (``survivors.stalled_s``), shown as a tooltip


def _sig(value: float, digits: int = 4) -> str:
    return f"{value:.{digits}g}"


def _seconds(value: float) -> str:
    if abs(value) < 90:
        return f"{_sig(value, 3)} s"
    return f"{_sig(value, 4)} s ({human_seconds(value)})"


def _bytes(value: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


# Unit suffixes, longest first: (suffix, formatter).
_UNITS: tuple[tuple[str, Any], ...] = (
    ("_mib_per_step", lambda v: f"{_sig(v, 3)} MiB per step"),
    ("_gbps", lambda v: f"{_sig(v, 3)} GB/s"),
    ("_gib", lambda v: f"{_sig(v, 3)} GiB"),
    ("_bytes", _bytes),
    ("_pct", lambda v: f"{_sig(v, 3)} %"),
    ("_ms", lambda v: f"{_sig(v, 3)} ms"),
    ("_s", _seconds),
    ("_x", lambda v: f"{_sig(v, 3)}×"),
    ("ratio", lambda v: f"{_sig(v, 3)}×"),
)
_SUFFIX_WORDS = {"_gbps", "_gib", "_bytes", "_pct", "_ms", "_s", "_x", "_mib_per_step"}


def label_of(key: str) -> str:
    """``median_compute_s`` → ``median compute time``; ``loss_first_step`` → ``loss first step``."""
    if key in LABELS:
        return LABELS[key]
    words = key
    for suffix in _SUFFIX_WORDS:
        if words.endswith(suffix) and len(words) > len(suffix):
            words = words[: -len(suffix)]
            break
    return words.replace("_", " ").strip()


def value_text(key: str, value: Any) -> str:
    """A value with the unit its key implies; booleans as yes/no, lists comma-separated."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        if key not in _PLAIN:
            for suffix, fmt in _UNITS:
                if key.endswith(suffix):
                    return str(fmt(float(value)))
        return str(value) if isinstance(value, int) else _sig(value, 6)
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(_scalar(v) for v in value):
        return ", ".join(value_text(key, v) for v in value) or "none"
    if isinstance(value, list) and all(_pair(v) for v in value):
        return ", ".join(f"{a}–{b}" for a, b in value)  # step ranges: [[10, 20], …]
    return json.dumps(value, default=str)


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, str | int | float | bool)


def _pair(v: Any) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v)


def evidence_rows(
    evidence: Mapping[str, Any], *, skip: Iterable[str] = (), _path: str = "", _label: str = ""
) -> list[EvidenceRow]:
    """The evidence flattened to rows (see the module doc); top-level keys in ``skip`` are
    left out (shown by a view of their own, e.g. a Flight Recorder table)."""
    out: list[EvidenceRow] = []
    skipped = set(skip)
    for key, value in evidence.items():
        if key in skipped:
            continue
        path = f"{_path}{key}"
        label = f"{_label}{label_of(key)}"
        if isinstance(value, dict) and value and all(str(k).isdigit() for k in value):
            out.extend(  # per rank: {"3": 12.5} keeps its parent's unit
                EvidenceRow(f"{label} · rank {r}", value_text(key, v), f"{path}.{r}")
                for r, v in sorted(value.items(), key=lambda item: int(item[0]))
            )
        elif isinstance(value, dict) and value:
            out.extend(evidence_rows(value, _path=f"{path}.", _label=f"{label} › "))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            singular = label.removesuffix("s") if label.endswith("s") else label
            for i, item in enumerate(value, 1):
                out.extend(
                    evidence_rows(item, _path=f"{path}[{i - 1}].", _label=f"{singular} {i} › ")
                )
        else:
            out.append(EvidenceRow(label=label, value=value_text(key, value), key=path))
    return out


# --- a Flight Recorder import's evidence: the CLI's table ---------------------------------

# Shown by ``flight_recorder_view`` (the first process group's fields are its starred row),
# so left out of the generic rows of a Flight Recorder import.
FLIGHT_RECORDER_KEYS = (
    "process_groups",
    "p2p_waits",
    "culprit_reasons",
    "held_up_ranks",
    "pg",
    "pg_desc",
    "seq",
    "op",
    "input_sizes",
    "input_dtypes",
    "waiting_ranks",
    "missing_ranks",
    "blocked_ranks",
    "entered_ns",
)


def evidence_context(evidence: Mapping[str, Any]) -> dict[str, Any]:
    """The incident page's evidence: ``flight_recorder`` (the CLI's table, or None) and
    ``evidence`` (rows of everything that table does not show)."""
    fr = flight_recorder_view(evidence)
    skip = FLIGHT_RECORDER_KEYS if fr is not None else ()
    return {"flight_recorder": fr, "evidence": evidence_rows(evidence, skip=skip)}


def flight_recorder_view(evidence: Mapping[str, Any]) -> dict[str, Any] | None:
    """The diagnosis of a Flight Recorder import, as ``vigil import flight-recorder`` prints
    it (the same data functions: ``divergence_rows``, ``p2p_rows``); None for other
    evidence."""
    if evidence.get("source") != "flight_recorder":
        return None
    groups = [g for g in evidence.get("process_groups") or [] if isinstance(g, dict)]
    waits = [w for w in evidence.get("p2p_waits") or [] if isinstance(w, dict)]
    reasons = evidence.get("culprit_reasons") or {}
    total = evidence.get("process_groups_total")
    return {
        "head": DIVERGENCE_HEAD,
        "rows": divergence_rows(groups),
        "more": max(0, int(total) - len(groups)) if isinstance(total, int) else 0,
        "p2p": p2p_rows(waits),
        "reasons": sorted(reasons.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0)
        if isinstance(reasons, dict)
        else [],
        "held_up": ranks_text(evidence.get("held_up_ranks") or []),
        "no_dump": ranks_text(evidence.get("no_dump_ranks") or []),
        "ranks_with_dumps": evidence.get("ranks_with_dumps", len(groups)),
    }


def ranks_text(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 7]`` → ``ranks 0–3, 7``; ``[5]`` → ``rank 5``; ``[]`` → ``""``."""
    rs = sorted({int(r) for r in ranks})
    if not rs:
        return ""
    parts, start = [], rs[0]
    for prev, cur in zip(rs, [*rs[1:], None], strict=True):
        if cur is None or cur != prev + 1:
            parts.append(str(start) if start == prev else f"{start}–{prev}")
            start = cur if cur is not None else start
    return f"rank{'s' if len(rs) > 1 else ''} {', '.join(parts)}"


def untimed_view(*, session: Session, job_id: int) -> dict[str, Any] | None:
    """The job page's "collectives not timed on ranks …" warning, or None."""
    found = untimed_collectives(session=session, job_id=job_id)
    if found is None:
        return None
    return {**found, "ranks_text": ranks_text(found["ranks"])}

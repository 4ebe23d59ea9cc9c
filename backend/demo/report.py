"""The demo's closing table: each injected fault, read back from Vigil's REST API."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table


@dataclass(frozen=True)
class Fault:
    """An injected fault and what Vigil should say about it."""

    name: str
    kind: str  # the incident kind that reports it
    ranks: tuple[int, ...]  # the ranks it should name
    step: int  # the step it starts at
    attempt: int  # the torchrun attempt it is injected in
    what: str


@dataclass
class Outcome:
    fault: Fault
    started: float | None = None  # wall time the fault began (from the job's own steps)
    incident: dict[str, Any] | None = None
    actions: list[dict[str, Any]] | None = None
    recovered: str = "—"
    recovered_ok: bool = False

    @property
    def detected_right(self) -> bool:
        return self.incident is not None and set(self.incident["ranks"]) == set(self.fault.ranks)


def summarize(
    api: httpx.Client, job: str, faults: list[Fault], returncode: int | None, console: Console
) -> bool:
    """Print the table; True when every fault was flagged with the right ranks and the job
    finished."""
    incidents = api.get(f"/jobs/{job}/incidents").json()
    actions = api.get(f"/jobs/{job}/actions").json()
    steps = _steps(api, job)
    outcomes = [_outcome(f, incidents, actions, steps) for f in faults]

    table = Table(title=f"what happened to {job}", show_lines=False)
    for column in ("fault", "started", "flagged", "ranks named", "action", "recovered"):
        table.add_column(column)
    for o in outcomes:
        f = o.fault
        started = f"step {f.step} · {_clock(o.started)}" if o.started else f"step {f.step} · —"
        if o.incident is None:
            flagged, named = "[red]not flagged[/red]", "—"
        else:
            detected = _epoch(o.incident["detected_at"])
            after = f" (+{detected - o.started:.1f} s)" if o.started else ""
            flagged = f"{_clock(detected)}{after} #{o.incident['id']}"
            ranks = ", ".join(map(str, o.incident["ranks"])) or "—"
            named = f"[green]{ranks} ✓[/green]" if o.detected_right else f"[red]{ranks} ✗[/red]"
        acted = ", ".join(f"{a['kind']} {a['state']}" for a in o.actions or []) or "none"
        table.add_row(f"{f.name}: {f.what}", started, flagged, named, acted, o.recovered)
    console.print(table)
    finished = returncode == 0
    ok = finished and all(o.detected_right for o in outcomes)
    verdict = "[green]every fault flagged with the right ranks[/green]"
    if not all(o.detected_right for o in outcomes):
        verdict = "[red]some faults were missed or blamed on the wrong ranks[/red]"
    console.print(
        f"{verdict}; the job {'finished' if finished else f'failed (exit {returncode})'}."
    )
    return ok


def _steps(api: httpx.Client, job: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 10_000}
        if cursor:
            params["cursor"] = cursor
        page = api.get(f"/jobs/{job}/steps", params=params).json()
        out += page["items"]
        cursor = page["next_cursor"]
        if not cursor:
            return out


def _outcome(
    f: Fault,
    incidents: list[dict[str, Any]],
    actions: list[dict[str, Any]],
    steps: list[dict[str, Any]],
) -> Outcome:
    o = Outcome(f)
    mine = [s for s in steps if s["attempt"] == f.attempt]
    if f.kind == "hang":  # the last progress before it: the end of the step before
        before = [s["ts"] for s in mine if s["step"] == f.step - 1]
        o.started = max(before) if before else None
    else:
        at = [s["ts"] - s["duration_s"] for s in mine if s["step"] == f.step]
        o.started = min(at) if at else None
    candidates = sorted(
        (i for i in incidents if i["kind"] == f.kind),
        key=lambda i: _epoch(i["detected_at"]),
    )
    if o.started is not None:
        candidates = [i for i in candidates if _epoch(i["detected_at"]) >= o.started - 1]
    o.incident = candidates[0] if candidates else None
    if o.incident is not None:
        o.actions = [a for a in actions if a["incident_id"] == o.incident["id"]]
    later = [s for s in steps if s["attempt"] > f.attempt and s["step"] >= f.step]
    if f.kind == "straggler":
        resolved = o.incident is not None and o.incident["status"] == "resolved"
        o.recovered, o.recovered_ok = (
            ("yes (incident resolved)", True) if resolved else ("no", False)
        )
    elif later:
        first = min(s["step"] for s in steps if s["attempt"] == later[0]["attempt"])
        finite = all(_finite(s["loss"]) for s in later)
        o.recovered_ok = finite
        o.recovered = (
            f"yes: attempt {later[0]['attempt']} resumed at step {first}"
            if finite
            else "no: NaN again"
        )
    else:
        o.recovered = "no"
    return o


def _finite(value: object) -> bool:
    return value is None or (isinstance(value, int | float) and math.isfinite(value))


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _clock(ts: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) if ts else "—"

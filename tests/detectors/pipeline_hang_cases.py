"""The recorded pipeline-parallel hangs of ``tests/data/pipeline_hangs/`` (see its README).

Each case holds what a real ``vigil server`` stored of a real hung gloo job (``server``)
and the ranks whose injected fault struck (``truth``); cases whose stages talk through
per-pair process groups also hold every rank's Flight Recorder dump (``fr/``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from detectors.finding import Finding
from detectors.hang import detect
from detectors.window import Inflight, RankState

DIR = Path(__file__).resolve().parents[1] / "data" / "pipeline_hangs"
CASES = sorted(p.parent.name for p in DIR.glob("*/case.json"))
FR_CASES = [name for name in CASES if (DIR / name / "fr").is_dir()]


def load(name: str) -> dict[str, Any]:
    case: dict[str, Any] = json.loads((DIR / name / "case.json").read_text())
    return case


def inflight(raw: dict[str, Any] | None) -> Inflight | None:
    """A stored in-flight op (the heartbeat's ``inflight``, as the server keeps it)."""
    if not raw:
        return None
    peers = raw.get("peers")
    return Inflight(
        group=raw["group"],
        op=raw["op"],
        seq=int(raw.get("seq") or 0),
        since=float(raw["since"]),
        peers=None if peers is None else tuple(peers),
    )


def rank_states(case: dict[str, Any]) -> list[RankState]:
    return [
        RankState(
            rank=r["rank"],
            last_step=r["last_step"],
            current_step=r["current_step"],
            last_step_ts=r["last_step_ts"],
            last_heartbeat_ts=r["last_heartbeat_ts"],
            inflight=inflight(r["inflight"]),
        )
        for r in case["server"]["ranks"]
    ]


def hang_findings(case: dict[str, Any]) -> list[Finding]:
    """The hang detector on the stored state, as the backend's sweep runs it at ``now``."""
    server = case["server"]
    return detect(
        rank_states(case),
        now=server["now"],
        step_durations=server["step_durations"],
        groups=server["groups"] or None,
        finished=False if server["expect_running"] else None,
    )


def fr_dumps(name: str) -> dict[int, bytes]:
    """Rank -> the bytes of its Flight Recorder dump."""
    return {
        int(p.name.rsplit("_", 1)[1]): p.read_bytes()
        for p in sorted((DIR / name / "fr").glob("_dump_*"))
    }

"""``vigil demo --swap``'s verdict and lines, from what the REST API said (``Seen``). The
scenario itself runs end to end in ``test_swap_end_to_end.py``; the command was run by hand
(its output is in the report of issue 14)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from backend.demo.swap_drift import DriftScenario, Seen
from backend.demo.swap_story import _lines, _problems, _summarize

SC = DriftScenario()
PEAKS = {64: {"base": 794180, "peak": 1922664}, 128: {"base": 794180, "peak": 3051112}}
BUDGET = 2374032


def closed_loop(**changes: Any) -> Seen:
    """What the API says once the loop closed (values from a real run)."""
    incident = {"id": 2, "kind": "opseq_change", "first_step": 40, "summary": "op sequence…"}
    pressure = {"id": 1, "kind": "memory_pressure", "first_step": 40, "summary": "memory…"}
    policy_params = {"version": 1, "offload": [{}] * 13, "storage_bytes": [0] * 33}
    seen = Seen(
        incident=incident,
        action={
            "id": 1,
            "kind": "apply_swap_policy",
            "requested_by": "policy",
            "reason": "swap policy v1 …",
            "params": {"policy": policy_params, "shape_fp": "7b9d"},
        },
        policy={
            "version": 1,
            "budget_bytes": 2255330,
            "predicted_peak_bytes": 2244168,
            "measured_peak_bytes": 2244168,
            "applied_step": 74,
        },
        results={
            0: {"applied": True, "version": 1, "from_step": 74, "peak_bytes": 2244168},
            1: {"applied": True, "version": 1, "from_step": 83, "peak_bytes": 2244168},
        },
        incidents=[pressure, incident],
    )
    for name, value in changes.items():
        setattr(seen, name, value)
    return seen


def test_a_closed_loop_passes_and_the_table_shows_measured_against_predicted() -> None:
    console = Console(record=True, width=120)
    assert _problems(SC, closed_loop()) == []
    assert _summarize(console, SC, closed_loop(), BUDGET, PEAKS, 0) is True
    text = console.export_text()
    assert "v1 measured peak" in text and "2,244,168" in text and "does not fit" in text
    assert "flagged from step 40; policy v1 applied from step 74 on every rank" in text


def test_late_detection_a_missing_rank_and_an_overrun_each_fail_the_demo() -> None:
    seen = closed_loop(results={0: closed_loop().results[0]})
    seen.incident = {**seen.incident, "first_step": 55}  # type: ignore[dict-item]
    seen.policy = {**seen.policy, "measured_peak_bytes": 2300000}  # type: ignore[dict-item]
    assert _problems(SC, seen) == [
        "the incident starts at step 55",
        "applied by ranks [0] of 2",
        "measured peak 2300000 over the 2255330 budget",
    ]
    assert _problems(SC, closed_loop(incident=None)) == ["no opseq_change incident"]
    assert _problems(SC, closed_loop(action=None)) == ["no apply_swap_policy action"]
    console = Console(record=True, width=120)
    assert _summarize(console, SC, seen, BUDGET, PEAKS, 0) is False
    assert "the loop did not close" in console.export_text()


def test_each_thing_is_said_once_under_its_own_key() -> None:
    lines = dict(_lines(closed_loop()))
    assert list(lines) == ["i1", "i2", "a1", "r0", "r1"]
    assert lines["i2"].startswith("[yellow]drift detected[/yellow]: incident #2")
    assert "offloads 13 of 33 saved tensor storages" in lines["a1"]
    assert "rank 1 applied v1 from step 83" in lines["r1"]

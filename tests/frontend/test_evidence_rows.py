"""Evidence as a person reads it: words for snake_case keys, units from the key's suffix,
per-rank and nested values spelled out; a Flight Recorder import's table from the same data
functions the CLI's report uses."""

from __future__ import annotations

from pathlib import Path

from backend.importers.flight_recorder import load_dumps
from backend.ui.evidence import (
    evidence_context,
    evidence_rows,
    flight_recorder_view,
    label_of,
    ranks_text,
)
from detectors import flight_recorder

FR_DUMPS = Path(__file__).parents[1] / "data" / "flight_recorder" / "lock_gil_1st"


def shown(evidence: dict[str, object], **kw: object) -> dict[str, str]:
    return {r.label: r.value for r in evidence_rows(evidence, **kw)}  # type: ignore[arg-type]


def test_keys_become_words_and_values_carry_their_units() -> None:
    rows = shown(
        {
            "median_compute_s": 0.43,
            "rise_pct": 31.5,
            "bandwidth_gbps": 1.234,
            "current_gib": 70.2,
            "slower_x": 3.0,
            "ratio": 1.62,
            "stalled_s": 7200.0,
            "ranks_affected": 4,
            "compared_with": "the other rank",
            "active": False,
        }
    )
    assert rows == {
        "median compute time": "0.43 s",
        "step time rise": "31.5 %",
        "bandwidth": "1.23 GB/s",
        "current": "70.2 GiB",
        "slower than its peers": "3×",
        "slower than the reference": "1.62×",
        "no step finished for": "7200 s (2 h)",
        "ranks affected": "4",
        "compared with": "the other rank",
        "active": "no",
    }
    assert not any("_" in label for label in rows)


def test_nested_per_rank_and_listed_values() -> None:
    rows = shown(
        {
            "silent_s": {"10": 61.0, "3": 12.5},
            "survivors": {"stalled_s": 30.0, "waiting_for": [1, 2]},
            "slow_groups": [{"group": "dp1", "bandwidth_gbps": 2.5}],
            "earlier_episodes": [[10, 20], [40, 60]],
        }
    )
    assert rows == {
        "silent for · rank 3": "12.5 s",
        "silent for · rank 10": "61 s",
        "survivors › no step finished for": "30 s",
        "survivors › waiting for": "1, 2",
        "slow group 1 › group": "dp1",
        "slow group 1 › bandwidth": "2.5 GB/s",
        "earlier episodes": "10–20, 40–60",
    }
    keys = [r.key for r in evidence_rows({"survivors": {"stalled_s": 1.0}})]
    assert keys == ["survivors.stalled_s"]  # the raw key stays, as a tooltip


def test_labels_and_rank_spans() -> None:
    assert label_of("loss_first_step") == "loss first step"
    assert label_of("heartbeat_timeout_s") == "heartbeat timeout"
    assert ranks_text([3, 0, 1, 2, 7]) == "ranks 0–3, 7"
    assert ranks_text([5]) == "rank 5" and ranks_text([]) == ""


def test_flight_recorder_table_is_the_clis() -> None:
    dumps = load_dumps(FR_DUMPS)
    [finding] = flight_recorder.analyze(dumps)
    view = flight_recorder_view(finding.evidence)
    assert view is not None
    report = flight_recorder.render(flight_recorder.diagnose(dumps))
    # Every row the page shows is a row of the CLI's table, in the same order.
    table = [line for line in report.splitlines() if " | " in line]
    assert table[0].split(" | ")[0].strip() == "PG" and view["head"][0] == "PG"
    cells = [[c.strip() for c in line.split(" | ")] for line in table[1:]]
    assert [list(r) for r in view["rows"]][: len(cells)] == cells
    assert [r for r, _ in view["reasons"]] == ["9", "14"]
    assert view["held_up"].startswith("ranks ")
    # Shown by the table: left out of the generic rows.
    rows = evidence_context(finding.evidence)["evidence"]
    labels = {r.label for r in rows}
    assert not labels & {"process group", "process group description", "process groups"}, rows
    assert not any(r.label.startswith("culprit reasons") for r in rows)
    assert labels >= {"source", "ranks with dumps", "no dump ranks"}
    assert evidence_context({"waiting_ranks": [1]})["evidence"][0].value == "1"  # a live hang's
    assert flight_recorder_view({"ratio": 2.0}) is None

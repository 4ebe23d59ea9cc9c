"""Flight Recorder dumps: parsing bytes safely, and culprits on a real 16-rank hang.

Reading dump files is the backend's job (``tests/backend/importers``); here every dump is
parsed from bytes, as ``detectors`` only ever sees them.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path
from typing import Any

import pytest

from detectors.flight_recorder import (
    Dump,
    UnsafeDumpError,
    analyze,
    diagnose,
    parse_dump,
    render,
)

LOCK_GIL = Path(__file__).parents[1] / "data" / "flight_recorder" / "lock_gil_1st"


# --- the real dumps --------------------------------------------------------------------------


def lock_gil_dumps() -> list[Dump]:
    """The recorded dumps ``_dump_<rank>`` of a 16-rank hang, parsed from their bytes."""
    ranks = {int(p.name.removeprefix("_dump_")): p for p in LOCK_GIL.glob("_dump_*")}
    return [parse_dump(ranks[r].read_bytes(), rank=r, source=str(ranks[r])) for r in sorted(ranks)]


def ground_truth() -> set[int]:
    log = (LOCK_GIL / "fault_injection.log").read_text()
    m = re.search(r"Fault ranks: \[([\d, ]+)\]", log)
    assert m
    return {int(r) for r in m.group(1).split(",")}


def reference() -> dict[str, str]:
    """The last row of NVIDIA's analyzer table: PGID | desc | op | size | dtype | missing."""
    lines = (LOCK_GIL / "reference_missing_ranks.txt").read_text().strip().splitlines()
    keys = ["pg", "desc", "op", "size", "dtype", "missing"]
    return dict(zip(keys, (c.strip() for c in lines[-1].split("|")), strict=True))


def test_names_ranks_9_and_14_like_the_ground_truth_and_the_reference() -> None:
    ref = reference()
    (f,) = analyze(lock_gil_dumps())
    assert (f.kind, f.severity) == ("hang", "critical")
    assert set(f.ranks) == ground_truth() == {9, 14}
    assert f.ranks == tuple(int(r) for r in ref["missing"].split(","))
    ev = f.evidence
    assert ev["pg"] == ref["pg"] == "72"
    assert ref["desc"].startswith(ev["pg_desc"])  # the reference appends ",0" (a window)
    assert ev["op"] == ref["op"] == "nccl:all_to_all"
    assert "x".join(map(str, ev["input_sizes"][0])) == ref["size"] == "2048x5120"
    assert ev["input_dtypes"] == [ref["dtype"]] == ["BFloat16"]
    assert ev["seq"] == 45265
    assert ev["waiting_ranks"] == [8, 10, 11, 12, 13, 15]
    assert ev["held_up_ranks"] == [r for r in range(16) if r not in (9, 14)]
    assert f.key == "hang:fr:pg=72:seq=45265" and f.first_step is None
    json.dumps(f.evidence)  # evidence is stored as JSON


def test_every_diverging_group_matches_the_full_reference() -> None:
    dg = diagnose(lock_gil_dumps())
    assert {dv.pg_name: dv.missing for dv in dg.divergences} == {
        "72": (9, 14),
        "64": (9, 14),
        "37": (9,),
        "38": (14,),
    }
    # Stage-0 ranks wait for stage 1 through unmatched pipeline sends and receives.
    assert {(w.rank, w.peer) for w in dg.p2p_waits} == {(r, r + 8) for r in range(8)}
    assert "no pending operation" in dg.reasons[9]


def test_render_is_a_readable_table() -> None:
    text = render(diagnose(lock_gil_dumps()))
    assert "Culprit ranks: 9, 14" in text
    row = next(line for line in text.splitlines() if line.startswith("72*"))
    for cell in ("EXPERT_MODEL_PARALLEL_GROUP", "nccl:all_to_all", "2048x5120", "BFloat16"):
        assert cell in row
    assert row.rstrip().endswith("| 9,14")


# --- safety ----------------------------------------------------------------------------------


def test_persistent_ids_are_refused() -> None:
    data = b"\x80\x02P0\n."  # PERSID "0"
    with pytest.raises(UnsafeDumpError):
        parse_dump(data, rank=0, source="x")


# --- synthetic dumps -------------------------------------------------------------------------


def entry(
    pg: str, seq: int, state: str = "scheduled", op: str = "nccl:all_reduce", **kw: Any
) -> dict[str, Any]:
    e: dict[str, Any] = {
        "record_id": kw.pop("record_id", seq),
        "pg_id": int(pg),
        "process_group": (pg, f"GROUP_{pg}"),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": op,
        "is_p2p": False,
        "input_sizes": [[4, 4]],
        "input_dtypes": ["Float"],
        "state": state,
        "retired": False,
        "time_created_ns": 1_000 + seq,
        "timeout_ms": 600_000,
    }
    e.update(kw)
    return e


def dump(rank: int, entries: list[dict[str, Any]], groups: dict[str, list[int]]) -> Dump:
    """Rank ``rank``'s dump, pickled as PyTorch writes it and parsed back."""
    raw = {
        "version": "2.9",
        "pg_config": {
            n: {"name": n, "desc": f"GROUP_{n}", "ranks": str(r)} for n, r in groups.items()
        },
        "pg_status": {},
        "entries": entries,
    }
    data = pickle.dumps(raw, protocol=2)
    return parse_dump(data, rank=rank, source=f"nccl_trace_rank_{rank}")


def test_healthy_dumps_have_no_findings() -> None:
    groups = {"0": [0, 1, 2, 3]}
    done = [entry("0", 5, "completed"), entry("0", 6, "completed")]
    dumps = [dump(r, done, groups) for r in range(4)]
    assert analyze(dumps) == []
    assert "No rank waits" in render(diagnose(dumps))


def test_all_members_present_is_not_a_culprit() -> None:
    groups = {"0": [0, 1]}
    dumps = [dump(r, [entry("0", 6)], groups) for r in range(2)]
    assert analyze(dumps) == []


def test_consequence_is_not_a_culprit() -> None:
    # tp "1" = {0, 1}, tp "2" = {2, 3}, dp "3" = {0, 2}, dp "4" = {1, 3}.
    # Rank 3 never entered tp "2" seq 9; rank 2 waits there, so it is missing from dp "3",
    # where rank 0 waits; rank 1 waits in dp "4" for rank 3 too. Only 3 is a culprit.
    groups = {"1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}
    dumps = [
        dump(0, [entry("3", 4)], {k: groups[k] for k in ("1", "3")}),
        dump(1, [entry("4", 4)], {k: groups[k] for k in ("1", "4")}),
        dump(2, [entry("2", 9)], {k: groups[k] for k in ("2", "3")}),
        dump(3, [entry("2", 8, "completed")], {k: groups[k] for k in ("2", "4")}),
    ]
    (f,) = analyze(dumps)
    assert f.ranks == (3,)
    assert {pg["pg"]: pg["missing_ranks"] for pg in f.evidence["process_groups"]} == {
        "2": [3],
        "3": [2],
        "4": [3],
    }


def test_rank_without_a_dump_is_named() -> None:
    groups = {"0": [0, 1, 2]}
    (f,) = analyze([dump(r, [entry("0", 3)], groups) for r in (0, 1)])
    assert f.ranks == (2,) and f.evidence["no_dump_ranks"] == [2]
    assert "no Flight Recorder dump" in f.evidence["culprit_reasons"]["2"]


def test_unmatched_p2p_names_the_peer() -> None:
    groups = {"5": [0, 1]}
    send = entry("5", 2, op="nccl:send 0->1", is_p2p=True, p2p_seq_id=7)
    dumps = [dump(0, [send], groups), dump(1, [], groups)]
    (f,) = analyze(dumps)
    assert f.ranks == (1,) and f.key == "hang:fr:p2p=0->1"
    # Once rank 1 posts the matching recv, nobody waits for anybody.
    dumps[1] = dump(1, [entry("5", 2, op="nccl:recv 1<-0", is_p2p=True)], groups)
    assert analyze(dumps) == []


def test_mismatched_order_is_a_cycle() -> None:
    # Rank 0 waits in pg "1" seq 4, rank 1 in pg "3" seq 1; neither entered the other's.
    groups = {"1": [0, 1], "3": [0, 1]}
    (f,) = analyze([dump(0, [entry("1", 4)], groups), dump(1, [entry("3", 1)], groups)])
    assert f.ranks == (0, 1)
    assert "mismatched order" in f.evidence["culprit_reasons"]["0"]

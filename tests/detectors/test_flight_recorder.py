"""Flight Recorder dumps: safe reading, and culprits on a real 16-rank hang."""

from __future__ import annotations

import builtins
import json
import os
import pickle
import pickletools
import re
from pathlib import Path
from typing import Any

import pytest

from detectors.flight_recorder import (
    FlightRecorderError,
    UnsafeDumpError,
    analyze,
    diagnose,
    load_dump,
    load_dumps,
    parse_dump,
    render,
)

LOCK_GIL = Path(__file__).parents[1] / "data" / "flight_recorder" / "lock_gil_1st"


# --- the real dumps --------------------------------------------------------------------------


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


def test_loads_every_rank_and_skips_other_files() -> None:
    dumps = load_dumps(LOCK_GIL)
    assert [d.rank for d in dumps] == list(range(16))
    d8 = dumps[8]
    assert d8.version == "2.9"
    assert d8.groups["72"].desc == "EXPERT_MODEL_PARALLEL_GROUP"
    assert d8.groups["72"].ranks == tuple(range(8, 16))
    assert d8.entries[0].op == "nccl:all_to_all" and d8.entries[0].collective_seq_id == 45265
    assert d8.entries[0].pending and d8.entries[0].input_sizes == ((2048, 5120),)
    assert dumps[9].entries == ()
    # pg_status is keyed by local pg id; rank 9 has no entries, the ids still map to names.
    assert dumps[9].status["72"].last_enqueued == 45264
    assert dumps[8].status["72"].last_enqueued == 45267


def test_names_ranks_9_and_14_like_the_ground_truth_and_the_reference() -> None:
    ref = reference()
    (f,) = analyze(load_dumps(LOCK_GIL))
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
    dg = diagnose(load_dumps(LOCK_GIL))
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
    text = render(diagnose(load_dumps(LOCK_GIL)))
    assert "Culprit ranks: 9, 14" in text
    row = next(line for line in text.splitlines() if line.startswith("72*"))
    for cell in ("EXPERT_MODEL_PARALLEL_GROUP", "nccl:all_to_all", "2048x5120", "BFloat16"):
        assert cell in row
    assert row.rstrip().endswith("| 9,14")


# --- safety ----------------------------------------------------------------------------------


class _Payload:
    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, ...]:
        return self.func, self.args

    def __call__(self, *args: Any) -> Any:  # the pickler wants the reduce target callable
        raise AssertionError("never called: pickling only")


def _payloads(marker: Path) -> dict[str, bytes]:
    touch = f"open({str(marker)!r}, 'w').write('pwned')"
    evil = {
        "os.system": _Payload(os.system, f"touch {marker}"),
        "builtins.eval": _Payload(builtins.eval, touch),
        "builtins.exec": _Payload(builtins.exec, touch),
        # getattr(__import__("os"), "system")("touch marker"), built from nested reduces.
        "builtins.getattr": _Payload(
            _Payload(getattr, _Payload(builtins.__import__, "os"), "system"), f"touch {marker}"
        ),
        "builtins.__import__": _Payload(builtins.__import__, "os"),
    }
    out = {}
    for name, obj in evil.items():
        # Hidden inside an otherwise plausible dump, at both protocols in use.
        for proto in (2, pickle.HIGHEST_PROTOCOL):
            data = pickle.dumps({"version": "2.9", "entries": [obj], "pg_config": {}}, proto)
            ops = {op.name for op, _, _ in pickletools.genops(data)}
            assert ops & {"GLOBAL", "STACK_GLOBAL"}  # the payload really asks for code
            out[f"{name}/p{proto}"] = data
    return out


def test_malicious_pickles_are_refused_and_not_executed(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    for name, data in _payloads(marker).items():
        path = tmp_path / "evil_dump_0"
        path.write_bytes(data)
        with pytest.raises(UnsafeDumpError, match="refused to load global") as exc:
            load_dump(path)
        assert str(path) in str(exc.value), name
        assert isinstance(exc.value, ValueError)
        assert not marker.exists(), f"{name} ran"


def test_persistent_ids_are_refused() -> None:
    data = b"\x80\x02P0\n."  # PERSID "0"
    with pytest.raises(UnsafeDumpError):
        parse_dump(data, rank=0, source="x")


# --- corrupt input ---------------------------------------------------------------------------


def test_truncated_dump_is_a_clear_error_naming_the_file(tmp_path: Path) -> None:
    data = (LOCK_GIL / "_dump_0").read_bytes()
    for cut in (0, 1, 40, len(data) // 2, len(data) - 1):
        path = tmp_path / "trace_0"
        path.write_bytes(data[:cut])
        with pytest.raises(FlightRecorderError, match="truncated or corrupt") as exc:
            load_dump(path)
        assert str(path) in str(exc.value) and isinstance(exc.value, ValueError)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x00garbage\xff" * 10, "truncated or corrupt"),
        (b'{"entries": [', "truncated or corrupt JSON"),
        (pickle.dumps([1, 2, 3]), "a dump is a dict"),
        (pickle.dumps({"version": "2.9"}), "no 'entries' list"),
        (pickle.dumps({"entries": [{"state": "scheduled"}]}), r"entries\[0\]"),
        (pickle.dumps({"entries": [], "pg_config": {"1": {"ranks": "[0, x]"}}}), "ranks"),
    ],
)
def test_corrupt_dumps_raise_value_errors(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "bad_3"
    path.write_bytes(data)
    with pytest.raises(FlightRecorderError, match=message) as exc:
        load_dump(path)
    assert str(path) in str(exc.value)


def test_missing_directory_rank_and_duplicates(tmp_path: Path) -> None:
    with pytest.raises(FlightRecorderError, match="no Flight Recorder dumps"):
        load_dumps(tmp_path)
    (tmp_path / "nodigits").write_bytes(pickle.dumps({"entries": []}))
    with pytest.raises(FlightRecorderError, match="unknown rank"):
        load_dump(tmp_path / "nodigits")
    (tmp_path / "a_1").write_bytes(pickle.dumps({"entries": []}))
    (tmp_path / "b_1.pkl").write_bytes(pickle.dumps({"entries": []}))
    with pytest.raises(FlightRecorderError, match="rank 1 again"):
        load_dumps(tmp_path)


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


def write(
    tmp_path: Path, rank: int, entries: list[dict[str, Any]], groups: dict[str, list[int]]
) -> None:
    dump = {
        "version": "2.9",
        "pg_config": {
            n: {"name": n, "desc": f"GROUP_{n}", "ranks": str(r)} for n, r in groups.items()
        },
        "pg_status": {},
        "entries": entries,
    }
    (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump, protocol=2))


def test_healthy_dumps_have_no_findings(tmp_path: Path) -> None:
    groups = {"0": [0, 1, 2, 3]}
    for r in range(4):
        write(tmp_path, r, [entry("0", 5, "completed"), entry("0", 6, "completed")], groups)
    dumps = load_dumps(tmp_path)
    assert analyze(dumps) == []
    assert "No rank waits" in render(diagnose(dumps))


def test_all_members_present_is_not_a_culprit(tmp_path: Path) -> None:
    groups = {"0": [0, 1]}
    for r in range(2):
        write(tmp_path, r, [entry("0", 6)], groups)
    assert analyze(load_dumps(tmp_path)) == []


def test_consequence_is_not_a_culprit(tmp_path: Path) -> None:
    # tp "1" = {0, 1}, tp "2" = {2, 3}, dp "3" = {0, 2}, dp "4" = {1, 3}.
    # Rank 3 never entered tp "2" seq 9; rank 2 waits there, so it is missing from dp "3",
    # where rank 0 waits; rank 1 waits in dp "4" for rank 3 too. Only 3 is a culprit.
    groups = {"1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}
    write(tmp_path, 0, [entry("3", 4)], {k: groups[k] for k in ("1", "3")})
    write(tmp_path, 1, [entry("4", 4)], {k: groups[k] for k in ("1", "4")})
    write(tmp_path, 2, [entry("2", 9)], {k: groups[k] for k in ("2", "3")})
    write(tmp_path, 3, [entry("2", 8, "completed")], {k: groups[k] for k in ("2", "4")})
    (f,) = analyze(load_dumps(tmp_path))
    assert f.ranks == (3,)
    assert {pg["pg"]: pg["missing_ranks"] for pg in f.evidence["process_groups"]} == {
        "2": [3],
        "3": [2],
        "4": [3],
    }


def test_rank_without_a_dump_is_named(tmp_path: Path) -> None:
    groups = {"0": [0, 1, 2]}
    for r in (0, 1):
        write(tmp_path, r, [entry("0", 3)], groups)
    (f,) = analyze(load_dumps(tmp_path))
    assert f.ranks == (2,) and f.evidence["no_dump_ranks"] == [2]
    assert "no Flight Recorder dump" in f.evidence["culprit_reasons"]["2"]


def test_unmatched_p2p_names_the_peer(tmp_path: Path) -> None:
    groups = {"5": [0, 1]}
    send = entry("5", 2, op="nccl:send 0->1", is_p2p=True, p2p_seq_id=7)
    write(tmp_path, 0, [send], groups)
    write(tmp_path, 1, [], groups)
    (f,) = analyze(load_dumps(tmp_path))
    assert f.ranks == (1,) and f.key == "hang:fr:p2p=0->1"
    # Once rank 1 posts the matching recv, nobody waits for anybody.
    write(tmp_path, 1, [entry("5", 2, op="nccl:recv 1<-0", is_p2p=True)], groups)
    assert analyze(load_dumps(tmp_path)) == []


def test_json_dumps_read_the_same(tmp_path: Path) -> None:
    dump = {
        "version": "2.9",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": [0, 1]}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": 3,
                "last_started_collective": -1,
                "last_completed_collective": 2,
            }
        },
        "entries": [entry("0", 3)],
    }
    (tmp_path / "rank_0.json").write_text(json.dumps(dump))
    d = load_dump(tmp_path / "rank_0.json")
    assert d.rank == 0 and d.groups["0"].ranks == (0, 1) and d.status["0"].last_completed == 2
    assert d.entries[0].input_sizes == ((4, 4),)


def test_mismatched_order_is_a_cycle(tmp_path: Path) -> None:
    # Rank 0 waits in pg "1" seq 4, rank 1 in pg "3" seq 1; neither entered the other's.
    groups = {"1": [0, 1], "3": [0, 1]}
    write(tmp_path, 0, [entry("1", 4)], groups)
    write(tmp_path, 1, [entry("3", 1)], groups)
    (f,) = analyze(load_dumps(tmp_path))
    assert f.ranks == (0, 1)
    assert "mismatched order" in f.evidence["culprit_reasons"]["0"]

"""Reading Flight Recorder dump files: one per rank, named ``*_<rank>``; crafted pickles are
refused without running, and unreadable files are errors that name the file."""

from __future__ import annotations

import builtins
import json
import os
import pickle
import pickletools
from pathlib import Path
from typing import Any

import pytest

from backend.importers.flight_recorder import load_dump, load_dumps
from detectors.flight_recorder import FlightRecorderError, UnsafeDumpError
from tests.detectors.test_flight_recorder import entry

LOCK_GIL = Path(__file__).parents[2] / "data" / "flight_recorder" / "lock_gil_1st"


# --- the real dumps --------------------------------------------------------------------------


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


# --- JSON ------------------------------------------------------------------------------------


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

"""Hang culprits behind point-to-point waits, on recorded pipeline-parallel hangs (issue 15.3).

Every case is a real gloo job (pipeline stages × data-parallel replicas) that a fault made
hang, as the server stored it (``tests/data/pipeline_hangs``). Ranks blocked in a pipeline
send or receive wait for their peer, which may itself wait: the detector must follow those
waits, through p2p ops and collectives, to their roots and name exactly the ranks that
faulted — neither the ranks that wait nor the peers of a waiting rank.
"""

from __future__ import annotations

import pytest

from detectors.flight_recorder import analyze, parse_dump
from tests.detectors.pipeline_hang_cases import CASES, FR_CASES, fr_dumps, hang_findings, load


def named(case_name: str) -> tuple[list[str], set[int], dict[str, str]]:
    """(finding kinds, ranks named, reasons) of the hang detector on a stored case."""
    findings = hang_findings(load(case_name))
    ranks = {r for f in findings for r in f.ranks}
    reasons = {k: v for f in findings for k, v in f.evidence.get("culprit_reasons", {}).items()}
    return [f.kind for f in findings], ranks, reasons


def test_the_recorded_cases_are_there() -> None:
    assert len(CASES) >= 12 and len(FR_CASES) >= 4
    for name in CASES:
        case = load(name)
        assert case["truth"], f"{name}: no fault struck"
        assert len(case["server"]["ranks"]) == case["world_size"]


@pytest.mark.parametrize("name", [n for n in CASES if not n.startswith("pairs")])
def test_heartbeats_name_the_adjacent_stage_of_the_same_replica_as_peer(name: str) -> None:
    """What the collector reported: a send or receive's peers are global ranks (the 1F1B
    schedule passes group ranks of the pipeline group, ``group_dst``/``group_src``)."""
    case = load(name)
    dp, seen = case["dp"], 0
    for row in case["server"]["ranks"]:
        peers = (row["inflight"] or {}).get("peers")
        for peer in peers or ():
            rank = row["rank"]
            assert peer % dp == rank % dp and abs(peer // dp - rank // dp) == 1, (rank, peer)
            seen += 1
    assert seen >= 2


@pytest.mark.parametrize("name", CASES)
def test_hang_detector_names_exactly_the_faulted_ranks(name: str) -> None:
    kinds, ranks, _ = named(name)
    assert len(kinds) == 1, kinds  # one finding: the recovery policy acts once
    assert sorted(ranks) == load(name)["truth"]


@pytest.mark.parametrize("name", CASES)
def test_crash_is_reported_only_for_a_rank_that_went_silent(name: str) -> None:
    """A rank holding the GIL sends no heartbeat (a crash, to the server); a rank that
    stopped or errored still does, and the others wait for it (a hang)."""
    case = load(name)
    kinds, _, _ = named(name)
    gil = any(f["kind"] == "gil" for f in case["faults_struck"])
    assert kinds == (["crash"] if gil else ["hang"])


@pytest.mark.parametrize("name", [n for n in CASES if "gil" not in n])
def test_every_culprit_has_a_reason_and_no_waiter_is_named(name: str) -> None:
    case = load(name)
    _, ranks, reasons = named(name)
    assert sorted(int(r) for r in reasons) == sorted(ranks)
    for r in case["truth"]:
        assert "in no collective" in reasons[str(r)]


@pytest.mark.parametrize("name", FR_CASES)
def test_flight_recorder_dumps_name_exactly_the_faulted_ranks(name: str) -> None:
    """Stages that talk through per-pair process groups (broadcast): their Flight Recorder
    dumps hold every wait. A rank holding the GIL could not write one."""
    dumps = [
        parse_dump(data, rank=r, source=f"{name}/_dump_{r}") for r, data in fr_dumps(name).items()
    ]
    (f,) = analyze(dumps)
    assert sorted(f.ranks) == load(name)["truth"]

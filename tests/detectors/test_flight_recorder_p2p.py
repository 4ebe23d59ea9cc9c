"""Flight Recorder: hang culprits behind point-to-point waits (issue 15, item 3).

NCCL issues a rank's operations in order: one it enqueued after an operation that is stuck
has not really been posted (its input is not there yet). So a receive is not satisfied by a
send its peer queued behind a stuck collective, and the receiver waits for that peer, which
waits for the stuck collective's culprit. These dumps are written in NCCL's format by hand
(two stages × two tensor-parallel ranks); ``test_pipeline_hangs`` checks real gloo dumps.

Stage 0 = ranks 0, 1 (``tp0``), stage 1 = ranks 2, 3 (``tp1``); pipeline pairs ``pp0`` =
{0, 2} and ``pp1`` = {1, 3}.
"""

from __future__ import annotations

import json
from typing import Any

from detectors.flight_recorder import analyze, diagnose, parse_dump

GROUPS = {
    "tp0": [0, 1],
    "tp1": [2, 3],
    "pp0": [0, 2],
    "pp1": [1, 3],
}


def op(record: int, pg: str, name: str, seq: int = 0, *, done: bool = False) -> dict[str, Any]:
    p2p = " " in name  # "send 0->1", "recv 1<-0"
    return {
        "record_id": record,
        "process_group": [pg, pg],
        "collective_seq_id": seq,
        "p2p_seq_id": record if p2p else 0,
        "profiling_name": f"nccl:{name}",
        "state": "completed" if done else "scheduled",
        "retired": done,
        "is_p2p": p2p,
    }


def dump(rank: int, *entries: dict[str, Any]) -> Any:
    pg_config = {n: {"desc": n, "ranks": json.dumps(r)} for n, r in GROUPS.items() if rank in r}
    raw = {"version": "2.9", "pg_config": pg_config, "entries": list(entries)}
    return parse_dump(json.dumps(raw).encode(), rank=rank, source=f"_dump_{rank}")


def stage1(rank2_entries: list[dict[str, Any]]) -> list[Any]:
    """Rank 2 blocked in its receive from rank 0 (plus what it had before); rank 3 waits
    for rank 2 in tp1's all-reduce 20, which rank 2 never reached."""
    return [
        dump(2, op(1, "tp1", "all_reduce", 19, done=True), *rank2_entries),
        dump(3, op(1, "tp1", "all_reduce", 19, done=True), op(2, "tp1", "all_reduce", 20)),
    ]


def test_a_send_queued_behind_a_stuck_collective_does_not_satisfy_the_receiver() -> None:
    """Rank 1 is stuck in Python: it never entered tp0's all-reduce 10. Rank 0 waits in it
    and has queued its send to rank 2 behind it. Rank 2 waits for rank 0, not for nobody:
    the one culprit is rank 1 (before: rank 2 too, a rank that only waits)."""
    dumps = [
        dump(0, op(1, "tp0", "all_reduce", 10), op(2, "pp0", "send 0->1", 10)),
        dump(1, op(1, "tp0", "all_reduce", 9, done=True)),
        *stage1([op(2, "pp0", "recv 1<-0", 19)]),
    ]
    dg = diagnose(dumps)
    assert dg.culprits == (1,)
    assert (2, 0) in {(w.rank, w.peer) for w in dg.p2p_waits}
    assert set(dg.held_up) == {0, 2, 3}


def test_a_collective_everyone_entered_waits_for_the_member_that_stopped_issuing() -> None:
    """Rank 1 entered tp0's all-reduce 10 and then froze; rank 0 entered it too and went on
    to enqueue 11 and 12 and a send to rank 2. No member is missing from 10, but rank 1
    never issued 11: it is the culprit, not rank 0, the peer rank 2 waits for."""
    dumps = [
        dump(
            0,
            op(1, "tp0", "all_reduce", 10),
            op(2, "tp0", "all_reduce", 11),
            op(3, "pp0", "send 0->1", 11),
            op(4, "tp0", "all_reduce", 12),
        ),
        dump(1, op(1, "tp0", "all_reduce", 10)),
        *stage1([op(2, "pp0", "recv 1<-0", 19)]),
    ]
    (f,) = analyze(dumps)
    assert f.ranks == (1,)
    tp0 = next(g for g in f.evidence["process_groups"] if g["pg"] == "tp0")
    assert (tp0["seq"], tp0["waiting_ranks"], tp0["missing_ranks"]) == (11, [0], [1])
    assert "never entered nccl:all_reduce seq 11 on pg tp0" in f.evidence["culprit_reasons"]["1"]


def test_a_send_and_receive_both_at_the_front_match() -> None:
    """Both sides posted and nothing older is stuck on either: they do not wait for each
    other (the pair is left out, as before); rank 1 never entered tp0's all-reduce."""
    dumps = [
        dump(0, op(1, "pp0", "send 0->1", 10), op(2, "tp0", "all_reduce", 10)),
        dump(1, op(1, "tp0", "all_reduce", 9, done=True)),
        dump(2, op(1, "pp0", "recv 1<-0", 19)),
        dump(3, op(1, "tp1", "all_reduce", 19, done=True)),
    ]
    dg = diagnose(dumps)
    assert dg.culprits == (1,) and dg.p2p_waits == ()

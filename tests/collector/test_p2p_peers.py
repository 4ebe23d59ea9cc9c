"""Point-to-point ops in the heartbeat: the peers a rank waits for (issue 15, item 3).

A real two-rank gloo job (``dist_jobs.p2p_peers``): rank 1 is late each time, so rank 0
waits, and its heartbeat must say for whom, so the server can follow a pipeline's waits.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.collector.dist_jobs import run_job


@pytest.fixture(scope="module")
def p2p(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_job("p2p_peers", tmp_path_factory.mktemp("p2p"))


def test_a_rank_blocked_in_recv_reports_the_peer_it_waits_for(p2p: list[dict[str, Any]]) -> None:
    beat = p2p[0]["recv"]
    assert (beat["group"], beat["op"], beat["peers"]) == ("world", "recv", [1])
    # A p2p op does not advance the group's collective seq: one all_reduce came before it.
    assert beat["seq"] == 1


def test_a_batch_of_p2p_ops_reports_its_peers_only_while_waited_on(
    p2p: list[dict[str, Any]],
) -> None:
    # Posted, not yet waited on: the rank is not blocked in it (it could be computing).
    assert p2p[0]["batch_posted"] is None
    beat = p2p[0]["batch"]
    assert (beat["op"], beat["peers"], beat["seq"]) == ("batch_isend_irecv", [1], 1)

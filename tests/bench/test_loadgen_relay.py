"""The load generator's node mode (``--relay``) against a real ``vigil server``: a node's
ranks go in one ``/api/v1/ingest/multi`` request per flush, each line is answered as that
rank's own batch, and every acknowledged step is stored once."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from bench.loadgen.generator import run
from bench.loadgen.options import Options
from tests.conftest import ADMIN, INGEST
from tests.servers import live_server

RANKS, PER_NODE = 16, 8


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_node_ships_its_ranks_in_one_request_per_flush_and_nothing_is_lost(tmp_path) -> None:
    with live_server(f"sqlite:///{tmp_path / 'vigil.db'}") as base:
        opts = Options(
            endpoints=[base],
            token=INGEST["Authorization"].removeprefix("Bearer "),
            read_token=ADMIN["Authorization"].removeprefix("Bearer "),
            ranks=RANKS,
            ranks_per_node=PER_NODE,
            relay=True,
            duration_s=4,
            step_s=0.5,
            warmup_s=1,
            settle_s=0,
            drain_s=10,
            report_s=60,
            job_prefix="relayed",
        )
        summary = asyncio.run(run(opts, out=lambda _: None))
        job = httpx.get(f"{base}/api/v1/jobs/relayed-0", headers=ADMIN, timeout=10)
        assert job.status_code == 200, job.text
    t = summary["totals"]
    assert t["rejected"] == 0 and t["server_errors"] == 0, t["rejections"]
    assert t["throttled"] == 0 and t["unsent_at_end"] == 0, t
    # Each post carries a line per rank of its node (fewer only for a rank that said goodbye).
    assert t["posts"] <= t["requests"] <= t["posts"] * PER_NODE
    assert t["requests"] >= 3 * t["posts"], t
    assert t["acked_steps"] > 0
    assert job.json()["steps_stored"] == t["acked_steps"]

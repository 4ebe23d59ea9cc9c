"""The short load run (issue 16, item 6): a few hundred simulated ranks ship over the real
ingest contract to a real distributed Vigil — two API processes (nodes spread over them, as
behind a load balancer), a Celery worker and beat, PostgreSQL and Redis — for about a
minute, while a straggler, a hang, a crash and a NaN are injected. It checks that nothing
acknowledged was lost or stored twice and that every fault was found with the right ranks
within issue 16's bounds (straggler 10 s after onset, hang max(5 × step, 10 s) + 10 s,
crash 15 s; NaN 10 s), and that nothing else opened.

Two jobs, because a hang or a crash stops a synchronous job: job 0 gets the straggler and
then the hang, job 1 the NaN and then the crash. Steps are 0.5 s so that the straggler
detector's persistence (5 slow steps) and its first baseline fit in the minute. The ranks
ship as a cluster does behind per-host relays (``--relay``: one ``/ingest/multi`` request
per node of 8 ranks and second, as ``vigil relay`` sends): 2 × 128 ranks at 0.5-s steps are
as many rank-steps a second as 512 ranks at 1-s steps, the largest job measured whole on a
2-core machine (bench/README.md, "Through relays"). ``VIGIL_LOAD_RANKS`` (ranks per job,
default 128) scales it. The table ``bench.loadgen`` prints is in the output (``-s``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ADMIN, INGEST
from tests.reliability.stack import VigilStack, wait_log

RANKS = int(os.environ.get("VIGIL_LOAD_RANKS", "128"))  # per job; two jobs
STEP_S = 0.5
FAULTS = (
    f"straggler@15s:rank=7:factor=1.5,hang@22s:rank={RANKS - 28},"
    f"nan@15s:rank=3:job=1,crash@22s:rank={RANKS // 2 + 2}:job=1"
)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_short_load_run_loses_nothing_and_finds_every_fault(
    tmp_path: Path, reliability_redis: str, reliability_db: str
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    main = VigilStack(tmp_path / "a", db_url=reliability_db, redis_url=reliability_redis)
    second = VigilStack(tmp_path / "b", db_url=reliability_db, redis_url=reliability_redis)
    try:
        main.start_worker()
        main.start_beat()
        main.start_server()
        second.start_server()
        wait_log(main, "worker", " ready.", 60)
        pids = {
            "api": f"{main.procs['server'].pid},{second.procs['server'].pid}",
            "worker": str(main.procs["worker"].pid),
            "beat": str(main.procs["beat"].pid),
        }
        summary_path = tmp_path / "summary.json"
        cmd = [
            sys.executable, "-m", "bench.loadgen",
            "--endpoint", main.base, "--endpoint", second.base,
            "--token", INGEST["Authorization"].split()[1],
            "--read-token", ADMIN["Authorization"].split()[1],
            "--jobs", "2", "--ranks", str(RANKS), "--tp", "8", "--step-s", str(STEP_S),
            "--minutes", "0.6", "--settle-s", "25", "--report-s", "10", "--relay",
            "--faults", FAULTS,
            "--database-url", reliability_db,
            "--json", str(summary_path),
        ]  # fmt: skip
        for name, spec in pids.items():
            cmd += ["--cpu", f"{name}={spec}"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        print(done.stdout[: done.stdout.rfind("\n{")], done.stderr[-3000:])
        assert summary_path.exists(), f"no summary:\n{done.stdout[-3000:]}\n{done.stderr}"
        summary = json.loads(summary_path.read_text())
    finally:
        second.stop()
        main.stop()

    totals, stored = summary["totals"], summary["stored"]
    assert totals["acked_steps"] > 0.8 * 2 * RANKS * 22 / STEP_S  # the jobs ran ~22 s
    assert totals["rejected"] == 0, totals["rejections"]
    assert summary["lost"] == {"steps": 0, "collectives": 0}, (totals, stored)
    assert stored["duplicate_steps"] == 0
    assert totals["unsent_at_end"] == 0
    for fault in summary["detection"]["faults"]:
        assert fault["found"], fault
        assert fault["within_bound"], fault
    assert not summary["detection"]["unexpected"], summary["detection"]["unexpected"]
    assert done.returncode == 0 and summary["passed"]

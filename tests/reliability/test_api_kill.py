"""``kill -9`` of the API while real collector processes stream steps to it, twice, each
time restarted on the same port: every step the ranks made is stored exactly once.

A batch whose reply the collector never got (the server died between its commit and its
answer, or before its commit) is sent again with the same ``batch_id``; the server must
store the first and recognise the second. Embedded mode on PostgreSQL: the API is the only
process that writes, so nothing else can hide a loss or a duplicate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.reliability.stack import VigilStack, stored_steps, wait_for

RANKS, STEPS = 2, 400
SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import collector as vigil

    vigil.init()
    for n in range(int(sys.argv[1])):
        with vigil.step(n):
            time.sleep(0.02)
    delivered = vigil.flush(timeout=120)
    print(json.dumps({"delivered": delivered, **vigil.stats()}), flush=True)
    """
)


def start_ranks(tmp_path: Path, base: str, job: str) -> list[subprocess.Popen[str]]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    procs = []
    for rank in range(RANKS):
        env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
        env.update(
            VIGIL_ENDPOINT=base,
            VIGIL_TOKEN="vigil-dev-ingest",
            VIGIL_JOB=job,
            VIGIL_FLUSH_S="0.1",
            RANK=str(rank),
            WORLD_SIZE=str(RANKS),
            PYTHONPATH=str(Path(__file__).resolve().parents[2]),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), str(STEPS)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_every_step_stored_exactly_once_across_two_api_kills(tmp_path, reliability_db):
    stack = VigilStack(tmp_path, db_url=reliability_db, redis_url=None, VIGIL_LOG_LEVEL="WARNING")
    ranks: list[subprocess.Popen[str]] = []
    try:
        stack.start_server()
        ranks = start_ranks(tmp_path, stack.base, "kill-api")
        total = RANKS * STEPS
        for share in (0.25, 0.55):  # kill -9 while the ranks stream, restart on the port
            wait_for(
                lambda s=share: len(stored_steps(reliability_db, "kill-api")) >= s * total,
                60,
                f"{share:.0%} of the steps stored",
            )
            stack.kill9("server")
            time.sleep(0.5)
            stack.start_server()
        reports = []
        for proc in ranks:
            out, _ = proc.communicate(timeout=180)
            assert proc.returncode == 0, out
            reports.append(json.loads(out.strip().splitlines()[-1]))
        assert all(r["delivered"] for r in reports), reports
        assert all(not r["dropped"] for r in reports), reports

        rows = stored_steps(reliability_db, "kill-api")
        counts = Counter(rows)
        dupes = sorted(k for k, n in counts.items() if n > 1)
        expected = {(rank, n) for rank in range(RANKS) for n in range(STEPS)}
        missing = sorted(expected - set(counts))
        sent = sum(r["sent_events"] for r in reports)
        counts_ = f"{total} steps ({sent} events sent) | {len(rows)} stored | {len(dupes)} dup"
        print(f"durability | 2 API kill -9 | {counts_}")
        assert not dupes, f"{len(dupes)} steps stored twice, e.g. {dupes[:5]}"
        assert not missing, f"{len(missing)} steps missing, e.g. {missing[:5]}"
        assert len(rows) == total
        assert stack.started["server"] == 3
    finally:
        for proc in ranks:
            proc.kill()
        stack.stop()

"""Closed loop on a real job: a 2-rank gloo DDP job under ``torchrun --max-restarts`` that
checkpoints; VIGIL_CHAOS hangs rank 1 (first attempt only). Vigil detects the hang, its
recovery policy (``auto`` for hangs) issues ``restart``, both ranks' collectors exit with
code 75, torchrun restarts the group, the job resumes from its last checkpoint and
finishes, and the hang incident resolves. Every link is checked through the REST API."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ADMIN
from tests.servers import kill_tree, live_server

pytest.importorskip("torch")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_tiny_gpt.py"
JOB = "closed-loop-hang"
FAST = {"VIGIL_DETECT_INTERVAL_S": "0.5", "VIGIL_SWEEP_INTERVAL_S": "0.5"}
STEPS, HANG_AT, CKPT_EVERY = 40, 17, 5


def launch(base: str, ckpt_dir: Path) -> subprocess.Popen[str]:
    command = [
        *(sys.executable, "-m", "backend", "run", "--job", JOB, "--endpoint", base),
        *("--token", "vigil-dev-ingest", "--chaos", f"hang:rank=1,at_step={HANG_AT}", "--"),
        *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
        *("--nproc-per-node", "2", "--max-restarts", "3", str(EXAMPLE)),
        *("--dim", "32", "--layers", "1", "--seq", "32", "--steps", str(STEPS)),
        *("--ckpt-dir", str(ckpt_dir), "--ckpt-every", str(CKPT_EVERY)),
    ]
    env = {**os.environ, "VIGIL_HEARTBEAT_S": "0.25", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def get(base: str, path: str) -> list[dict] | dict:
    reply = httpx.get(f"{base}/api/v1{path}", headers=ADMIN, timeout=10)
    reply.raise_for_status()
    return reply.json()  # type: ignore[no-any-return]


def all_steps(base: str) -> list[dict]:
    out, cursor = [], None
    while True:
        page = get(base, f"/jobs/{JOB}/steps?limit=10000" + (f"&cursor={cursor}" if cursor else ""))
        out += page["items"]  # type: ignore[call-overload,index]
        cursor = page["next_cursor"]  # type: ignore[call-overload,index]
        if not cursor:
            return out


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_hang_is_detected_restarted_resumed_and_resolved(sqlite_url, tmp_path):
    with live_server(sqlite_url, **FAST) as base:
        reply = httpx.put(
            f"{base}/api/v1/jobs/{JOB}/policies/hang", json={"mode": "auto"}, headers=ADMIN
        )
        assert reply.status_code in (200, 201), reply.text
        proc = launch(base, tmp_path / "ckpt")
        try:
            out, _ = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            out, _ = proc.communicate()
            state = {p: get(base, f"/jobs/{JOB}/{p}") for p in ("incidents", "actions", "audit")}
            pytest.fail(f"the job did not finish in 180 s\n{state}\n{out[-5000:]}")
        finally:
            kill_tree(proc.pid)
        assert proc.returncode == 0, out  # torchrun: the restarted group finished
        assert "resumed from" in out, out

        # 1. Detected: one hang incident naming rank 1 at the step it hung before (and no
        # crash: ranks that exit for a restart say goodbye first).
        deadline = time.monotonic() + 30
        while True:
            hangs = [i for i in get(base, f"/jobs/{JOB}/incidents") if i["kind"] == "hang"]  # type: ignore[index,union-attr]
            if (hangs and hangs[0]["status"] == "resolved") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert len(hangs) == 1, hangs
        kinds = {i["kind"] for i in get(base, f"/jobs/{JOB}/incidents")}  # type: ignore[index,union-attr]
        assert "crash" not in kinds, kinds
        [hang] = hangs
        assert hang["ranks"] == [1] and hang["first_step"] == HANG_AT, hang

        # 2. Acted: the policy asked for a restart for that incident, with its reasoning,
        # and the ranks that ran it reported exit code 75. Not necessarily both: each rank
        # fetches the action with its own next heartbeat, and once the first one exits
        # torchrun tears the whole group down, so the other may be killed before its turn.
        actions = get(base, f"/jobs/{JOB}/actions")
        restarts = [a for a in actions if a["kind"] == "restart"]  # type: ignore[index,union-attr]
        assert len(restarts) == 1, actions
        [restart] = restarts
        assert restart["incident_id"] == hang["id"] and restart["requested_by"] == "policy"
        assert restart["reasoning"] and restart["reason"]
        assert restart["state"] == "succeeded", restart
        assert restart["deliveries"] and set(restart["deliveries"]) <= {"0", "1"}, restart
        assert {d["result"]["exit_code"] for d in restart["deliveries"].values()} == {75}

        # 3. Resumed: the last attempt starts right after the last checkpoint before the
        # hang and runs to the end; attempt 0 never got past the hung step. (torchrun may
        # need more than one try: a gloo group re-formed at once sometimes reads a dead
        # peer's address and fails in init, which the next try gets past.)
        steps = all_steps(base)
        final = max(s["attempt"] for s in steps)
        assert final >= 1
        attempt0 = [s["step"] for s in steps if s["attempt"] == 0]
        resumed = [s["step"] for s in steps if s["attempt"] == final]
        assert max(attempt0) < HANG_AT
        resumed_at = (HANG_AT - 1) // CKPT_EVERY * CKPT_EVERY + 1  # last checkpoint + 1
        assert (min(resumed), max(resumed)) == (resumed_at, STEPS - 1)

        # 4. Resolved: the hang incident closed once the ranks made progress again, and
        # the audit trail tells the story.
        assert hang["status"] == "resolved", hang
        audit = get(base, f"/jobs/{JOB}/audit")
        events = [(e["actor"], e["event"]) for e in audit]  # type: ignore[index,union-attr]
        assert ("policy", "created") in events, events

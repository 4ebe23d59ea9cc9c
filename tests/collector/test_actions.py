"""Actions round trip: triggered over REST, run on the rank, reported back."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

import collector as vigil
from tests.conftest import ADMIN
from tests.servers import live_server

JOB = "actions-job"


def wait_for_state(base: str, action_id: int, states: set[str], timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        action = httpx.get(f"{base}/api/v1/actions/{action_id}", headers=ADMIN).json()
        if action["state"] in states or time.monotonic() > deadline:
            return action
        time.sleep(0.1)


def trigger(base: str, kind: str, **params) -> dict:  # type: ignore[no-untyped-def]
    reply = httpx.post(
        f"{base}/api/v1/jobs/{JOB}/actions", json={"kind": kind, "params": params}, headers=ADMIN
    )
    assert reply.status_code == 201, reply.text
    return reply.json()


def test_dump_stacks_and_custom_handler(sqlite_url):
    calls = []

    @vigil.on_action("checkpoint_now")
    def checkpoint(params):  # type: ignore[no-untyped-def]
        calls.append(params)
        return {"path": params["path"]}

    with live_server(sqlite_url) as base:
        vigil.init(
            job=JOB, endpoint=base, token="vigil-dev-ingest", heartbeat_s=0.1, integrations=False
        )
        with vigil.step(0):
            pass
        assert vigil.flush(timeout=10)
        stacks = trigger(base, "dump_stacks")
        ckpt = trigger(base, "checkpoint_now", path="/tmp/ckpt-0")
        unknown = trigger(base, "rollback")

        done = wait_for_state(base, stacks["id"], {"succeeded", "failed"})
        assert done["state"] == "succeeded", done
        assert done["result"]["0"]["threads"] >= 2  # main thread and the collector's
        assert wait_for_state(base, ckpt["id"], {"succeeded"})["result"] == {
            "0": {"path": "/tmp/ckpt-0"}
        }
        assert calls == [{"path": "/tmp/ckpt-0"}]
        failed = wait_for_state(base, unknown["id"], {"failed"})
        assert "no handler for 'rollback'" in failed["result"]["0"]["error"]


TRAIN_FOREVER = (
    "import time, collector as vigil\n"
    "vigil.init(integrations=False)\n"
    "@vigil.on_action('rollback')\n"
    "def rollback(params):\n"
    "    return {'rolled_back_to': params['to_step'], 'restart': True}\n"
    "for n in range(100000):\n"
    "    with vigil.step(n):\n"
    "        time.sleep(0.01)\n"
)


@pytest.mark.parametrize("kind", ["exit_for_restart", "rollback"])
def test_exit_for_restart_exits_with_the_restart_code(sqlite_url, tmp_path, kind):
    """Built in (exit_for_restart), or asked for by a handler's result (rollback)."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN_FOREVER)
    with live_server(sqlite_url) as base:
        env = {
            **os.environ,
            "VIGIL_ENDPOINT": base,
            "VIGIL_TOKEN": "vigil-dev-ingest",
            "VIGIL_JOB": JOB,
            "VIGIL_HEARTBEAT_S": "0.1",
        }
        proc = subprocess.Popen([sys.executable, str(script)], env=env)
        try:
            deadline = time.monotonic() + 30
            while httpx.get(f"{base}/api/v1/jobs/{JOB}", headers=ADMIN).status_code != 200:
                assert time.monotonic() < deadline, "the job never reported"
                time.sleep(0.1)
            action = trigger(base, kind, to_step=3)
            assert proc.wait(timeout=30) == 75
        finally:
            proc.kill()
        done = wait_for_state(base, action["id"], {"succeeded", "failed"})
        assert done["state"] == "succeeded"
        result = done["result"]["0"]
        assert result["exit_code"] == 75 if kind == "exit_for_restart" else result["restart"]

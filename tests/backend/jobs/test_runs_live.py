"""Runs end to end: real ``vigil run`` processes reporting to a real ``vigil server``.

Seen before: running README's ``vigil run --job tiny-gpt …`` twice merged both runs into
one job (steps 0-199 stored twice, both attempt 0), and the job page still said "live"
with every rank gone.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ADMIN
from tests.servers import live_server, vigil_env

SCRIPT = """
import collector as vigil
for n in range(200):
    with vigil.step(n):
        pass
    vigil.log(loss=1.0)
"""


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('runs') / 'vigil.db'}"
    with live_server(url, VIGIL_SWEEP_INTERVAL_S="0.5") as base:
        yield base


def vigil_run(base: str, job: str, script: Path) -> subprocess.CompletedProcess[str]:
    command = [
        *(sys.executable, "-m", "backend", "run", "--job", job, "--endpoint", base),
        *("--token", "vigil-dev-ingest", "--", sys.executable, str(script)),
    ]
    env = vigil_env("unused", VIGIL_HEARTBEAT_S="0.2", VIGIL_FLUSH_S="0.2")
    env.pop("VIGIL_DATABASE_URL")
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def get(base: str, job: str, path: str):  # type: ignore[no-untyped-def]
    reply = httpx.get(f"{base}/api/v1/jobs/{job}{path}", headers=ADMIN, timeout=10)
    assert reply.status_code == 200, reply.text
    return reply.json()


def wait_for(check, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)
    return result


def ended(base: str, job: str, *, runs: int) -> list[dict] | None:  # type: ignore[type-arg]
    """The job's runs once there are ``runs`` of them and none is running any more."""
    found = get(base, job, "/runs")
    return found if len(found) == runs and all(r["state"] != "running" for r in found) else None


def test_vigil_run_twice_gives_two_runs_each_with_its_own_steps(base, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    for _ in range(2):
        done = vigil_run(base, "tiny", script)
        assert done.returncode == 0, done.stdout + done.stderr
    runs = wait_for(lambda: ended(base, "tiny", runs=2))
    assert [(r["number"], r["state"]) for r in runs] == [(2, "finished"), (1, "finished")]
    for number in (1, 2):
        items = get(base, "tiny", f"/steps?run={number}&limit=1000")["items"]
        assert [s["step"] for s in items] == list(range(200))
        assert {(s["run"], s["attempt"]) for s in items} == {(number, 0)}
    job = get(base, "tiny", "")
    assert (job["state"], job["ranks_reporting"]) == ("finished", 0)
    page = httpx.get(f"{base}/jobs/tiny", headers=ADMIN, timeout=10).text
    assert "run-finished" in page


def test_an_uncaught_exception_is_a_failing_exit(base, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT + "raise RuntimeError('diverged')\n")
    done = vigil_run(base, "raises", script)
    assert done.returncode == 1
    ranks = wait_for(lambda: [r for r in get(base, "raises", "/ranks") if r["exited"]])
    assert [(r["rank"], r["exit_code"]) for r in ranks] == [(0, 1)]

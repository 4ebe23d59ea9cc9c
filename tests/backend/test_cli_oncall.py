"""The on-call commands (``vigil incidents / ack / resolve / silence / act``) against a real
``vigil server`` process whose own detection opened the incident. The commands run
in-process (typer's runner: the real command code over HTTP, without a process start per
call); the refusals that matter most are checked on a real ``vigil`` process too."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from backend.cli import app
from tests.conftest import ADMIN, INGEST
from tests.factories import batch, step
from tests.servers import free_port, live_server, run_vigil, vigil_env

JOB = "oncall-job"


class Server:
    def __init__(self, base: str, env: dict[str, str], incident: int) -> None:
        self.base, self.env, self.incident = base, env, incident

    def vigil(self, *args: str) -> Any:
        """``vigil ARGS --endpoint <server>``, in-process; exit code, stdout, stderr."""
        result = CliRunner().invoke(app, [*args, "--endpoint", self.base])
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            result.exception
        )
        return result


def refused(result: Any, code: int, *words: str) -> None:
    """Exit ``code`` and one line on stderr that says each of ``words``."""
    code_of = getattr(result, "exit_code", getattr(result, "returncode", None))
    assert code_of == code, (result.stdout, result.stderr)
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, result.stderr
    for word in words:
        assert word in line, line


def wait_for(fetch, ready, timeout: float = 60) -> Any:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if ready(value):
            return value
        assert time.monotonic() < deadline, f"not ready in {timeout} s: {value}"
        time.sleep(0.2)


class DivergedJob(threading.Thread):
    """A 2-rank job still training after its loss turned NaN at step 20: each rank sends a
    step (NaN loss) and a heartbeat every 0.3 s, through the real ingest API, until
    stopped; so its ranks stay live and it neither hangs nor crashes meanwhile."""

    def __init__(self, base: str, job: str = JOB) -> None:
        super().__init__(daemon=True)
        self.base, self.job, self.halt, self.step = base, job, threading.Event(), 0
        self.send([step(n, ts=time.time() - 9 + 0.3 * n, loss=loss(n)) for n in range(30)])
        self.step = 30

    def send(self, events: list[dict[str, Any]]) -> None:
        for rank in (0, 1):
            body = batch(events, job=self.job, rank=rank, world_size=2, run="launch-a")
            headers = {**INGEST, "Content-Type": "application/json"}
            reply = httpx.post(
                f"{self.base}/api/v1/ingest", content=json.dumps(body), headers=headers
            )
            reply.raise_for_status()

    def run(self) -> None:
        while not self.halt.wait(0.3):
            now = time.time()
            beat = {"type": "heartbeat", "ts": now, "step": self.step + 1}
            self.send([step(self.step, ts=now, loss=loss(self.step)), beat])
            self.step += 1

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=10)


def loss(n: int) -> float:
    return float("nan") if n >= 20 else 2.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server whose detection found the NaN loss of a live job."""
    url = f"sqlite:///{tmp_path_factory.mktemp('oncall') / 'vigil.db'}"
    with live_server(url, VIGIL_DETECT_INTERVAL_S="0.3") as base:
        job = DivergedJob(base)
        job.start()
        try:

            def incidents() -> list[dict[str, Any]]:
                url = f"{base}/api/v1/jobs/{JOB}/incidents"
                return httpx.get(url, headers=ADMIN).json()  # type: ignore[no-any-return]

            found = wait_for(incidents, lambda rows: any(i["kind"] == "nan" for i in rows))
            [nan] = [i for i in found if i["kind"] == "nan"]
            yield Server(base, vigil_env(url), nan["id"])
        finally:
            job.stop()


def test_an_incident_handled_from_the_command_line(server: Server) -> None:
    incident, vigil = str(server.incident), server.vigil
    listed = vigil("incidents", JOB, "--status", "open")
    assert listed.exit_code == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if f" {incident} " in line)
    assert "nan" in row and "#1" in row and "open" in row

    acked = vigil("ack", incident, "--note", "looking at the data loader")
    assert acked.exit_code == 0, acked.stderr
    assert f"incident {incident} (nan, job {JOB}) acknowledged by api:" in acked.stdout
    audit = httpx.get(f"{server.base}/api/v1/jobs/{JOB}/audit", headers=ADMIN).json()
    [ack] = [e for e in audit if e["event"] == "acknowledged"]
    assert ack["detail"] == {"note": "looking at the data loader"}

    silence = ("silence", "add", "--job", JOB, "--kind", "nan", "--for", "2h")
    silenced = vigil(*silence, "--note", "known bad shard")
    assert silenced.exit_code == 0, silenced.stderr
    assert f"(job={JOB}, kind=nan) active until" in silenced.stdout
    silence_id = silenced.stdout.split()[1]
    handled = vigil("incidents", JOB).stdout
    assert "acked by api:" in handled and f"silenced (#{silence_id})" in handled
    active = vigil("silence", "list", "--state", "active").stdout
    assert "known bad shard" in active and "kind=nan" in active

    acted = vigil("act", JOB, "dump_stacks", "--ranks", "1", "--incident", incident)
    assert acted.exit_code == 0, acted.stderr
    assert f"dump_stacks pending for 1 of job '{JOB}', for incident {incident}" in acted.stdout
    actions = httpx.get(f"{server.base}/api/v1/jobs/{JOB}/actions", headers=ADMIN).json()
    [action] = [a for a in actions if a["kind"] == "dump_stacks"]
    assert (action["incident_id"], action["target_ranks"]) == (server.incident, [1])

    resolved = vigil("resolve", incident, "--note", "shard replaced")
    assert resolved.exit_code == 0, resolved.stderr
    assert "resolved by api:" in resolved.stdout and "shard replaced" in resolved.stdout
    refused(vigil("resolve", incident, "--note", "again"), 1, "409", "resolved already")

    assert vigil("silence", "expire", silence_id).exit_code == 0
    refused(vigil("silence", "expire", silence_id), 1, "409", "already")
    gone = vigil("incidents", JOB, "--run", "1", "--status", "open")
    assert gone.exit_code == 0 and "no incidents" in gone.stdout


def test_refusals_are_one_line_with_an_exit_status(server: Server) -> None:
    incident, vigil = str(server.incident), server.vigil
    refused(vigil("incidents", JOB, "--run", "2"), 1, "404", "has no run 2")
    refused(vigil("ack", incident, "--token", "wrong"), 1, "401", "--token")
    refused(vigil("ack", incident, "--token", "vigil-dev-ingest"), 1, "403", "'admin' scope")
    refused(vigil("act", JOB, "restart", "--incident", "999"), 1, "404", "999")
    refused(vigil("act", JOB, "dump_stacks", "--ranks", "one"), 2, "--ranks")
    refused(vigil("silence", "add", "--job", JOB, "--for", "2 weeks", "--note", "x"), 2, "2h")
    refused(vigil("silence", "add", "--for", "2h", "--note", "x"), 2, "--job")
    unknown = ("silence", "add", "--kind", "gremlins", "--for", "2h", "--note", "x")
    refused(vigil(*unknown), 2, "422", "matchers.kind")

    # A real process: a job whose ranks all said goodbye has nobody left to act on.
    ended = DivergedJob(server.base, job="ended-job")
    ended.send([{"type": "heartbeat", "ts": time.time(), "exiting": True, "exit_code": 0}])
    runs = f"{server.base}/api/v1/jobs/ended-job/runs"
    wait_for(lambda: httpx.get(runs, headers=ADMIN).json()[0]["state"], "finished".__eq__)
    act = run_vigil(["act", "ended-job", "restart", "--endpoint", server.base], server.env)
    refused(act, 1, "run_not_live (409)", "finished")
    nobody = f"http://127.0.0.1:{free_port()}"
    refused(run_vigil(["silence", "list", "--endpoint", nobody], server.env), 1, "cannot reach")

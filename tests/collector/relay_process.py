"""A real ``python -m collector.relay`` process for tests, killable and restartable on its
port, and simulated ranks: real ``collector.Client``s in the test process, one per rank."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from collector.client import Client
from collector.config import Config
from tests.servers import free_port

TOKEN = "vigil-dev-ingest"
ROOT = Path(__file__).resolve().parents[2]


class RelayProcess:
    """``python -m collector.relay`` in front of ``upstream``; ``kill9`` and ``start`` again
    on the same port, as a node's relay that crashes and is restarted by its supervisor."""

    def __init__(self, upstream: str, workdir: Path, *args: str) -> None:
        self.upstream, self.args, self.workdir = upstream, args, workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> RelayProcess:
        self.starts += 1
        log = open(self.workdir / "relay.log", "ab")  # noqa: SIM115 (the process owns it)
        cmd = [sys.executable, "-m", "collector.relay", "--listen", f"127.0.0.1:{self.port}"]
        cmd += ["--endpoint", self.upstream, "--token", TOKEN, *self.args]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"relay exited:\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"relay not answering:\n{self.tail()}")
            time.sleep(0.05)

    def stats(self) -> dict:
        return httpx.get(f"{self.url}/stats", timeout=5).json()

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self) -> str:
        path = self.workdir / "relay.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else "(no output)"


def ranks(endpoint: str, job: str, n: int, **options: float) -> list[Client]:
    """``n`` ranks of one run of ``job``, each a real collector client (its own worker
    thread, buffer, retries and action runner) sending to ``endpoint``."""
    return [
        Client(
            Config.resolve(
                job=job,
                endpoint=endpoint,
                token=TOKEN,
                environ={"RANK": str(r), "WORLD_SIZE": str(n), "VIGIL_RUN_ID": f"{job}-run"},
                **options,
            )
        )
        for r in range(n)
    ]


def server_requests(base: str) -> dict[str, float]:
    """The server's ``vigil_ingest_requests_total`` by endpoint (single, multi)."""
    text = httpx.get(f"{base}/metrics", headers={"Authorization": "Bearer vigil-dev-admin"}).text
    out = {"single": 0.0, "multi": 0.0}
    for line in text.splitlines():
        if line.startswith("vigil_ingest_requests_total{"):
            name = line.split('endpoint="')[1].split('"')[0]
            out[name] = float(line.rsplit(" ", 1)[1])
    return out

"""Start real ``vigil`` processes for tests that need a server over HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx

from backend.launch import kill_tree

VIGIL = [sys.executable, "-m", "backend"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def vigil_env(database_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    env.update({"VIGIL_DATABASE_URL": database_url, "VIGIL_LOG_LEVEL": "WARNING", **extra})
    return env


def run_vigil(
    args: list[str], env: Mapping[str, str], cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*VIGIL, *args], env=dict(env), cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


@contextmanager
def live_server(database_url: str, **extra_env: str) -> Iterator[str]:
    """``vigil server`` on a free port; yields its base URL and stops it afterwards."""
    with live_server_on(database_url, free_port(), **extra_env) as base:
        yield base


@contextmanager
def live_server_on(database_url: str, port: int, **extra_env: str) -> Iterator[str]:
    """``vigil server`` on ``port`` (to restart a server where clients expect it)."""
    with http_process(
        [*VIGIL, "server", "--port", str(port), "--migrate"],
        vigil_env(database_url, **extra_env),
        port=port,
        health="/healthz",
        what="vigil server",
    ) as base:
        yield base


@contextmanager
def http_process(
    cmd: list[str], env: Mapping[str, str], *, port: int, health: str, what: str
) -> Iterator[str]:
    """Run an HTTP server process, wait until ``health`` answers 200, yield its base URL,
    and stop it afterwards."""
    proc = subprocess.Popen(
        cmd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited: {proc.stdout.read()}")  # type: ignore[union-attr]
            try:
                if httpx.get(f"{base}{health}", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not answer {health} within 60 s")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def vigil_process(args: list[str], env: Mapping[str, str]) -> Iterator[subprocess.Popen[str]]:
    """A long-running ``vigil`` command (worker, beat) for the duration of a test."""
    proc = subprocess.Popen(
        [*VIGIL, *args],
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        kill_tree(proc.pid)
        proc.wait()


class Receiver:
    """A webhook receiver the test starts: records every POST; can be told to fail.

    >>> with Receiver() as rx:
    ...     url = rx.url("/am")        # point a Vigil webhook here
    ...     rx.wait(lambda reqs: len(reqs) >= 1, timeout=5)
    """

    def __init__(self) -> None:
        import http.server
        import threading

        self.requests: list[dict[str, object]] = []
        self.fail_next = 0  # answer this many requests with 500 first
        self._lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with outer._lock:
                    failing = outer.fail_next > 0
                    outer.fail_next -= int(failing)
                    outer.requests.append(
                        {
                            "path": self.path,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": body,
                            "answered": 500 if failing else 200,
                        }
                    )
                self.send_response(500 if failing else 200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def received(self, path: str | None = None) -> list[dict[str, object]]:
        with self._lock:
            return [r for r in self.requests if path is None or r["path"] == path]

    def wait(self, ready, timeout: float = 30) -> list[dict[str, object]]:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not ready(self.received()):
            if time.monotonic() > deadline:
                raise AssertionError(f"receiver: condition not met in {timeout} s: {self.requests}")
            time.sleep(0.1)
        return self.received()

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

"""Run the example model server for a test: in a thread of the test process (cheap: any
config, chaos included) or as its own process, the way users start it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn

from examples.serving.model_server import ServerConfig, create_app
from tests.servers import free_port


@contextmanager
def served(config: ServerConfig | None = None) -> Iterator[str]:
    """``create_app(config)`` under uvicorn in a thread; yields the base URL."""
    app = create_app(config or ServerConfig())
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        assert thread.is_alive(), "uvicorn exited"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@contextmanager
def model_server_process(*args: str, **env: str) -> Iterator[str]:
    """``python -m examples.serving.model_server --port <free> ARGS``; yields the base URL."""
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "examples.serving.model_server", "--port", str(port), *args],
        env={**environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"model server exited: {proc.stdout.read()}")  # type: ignore[union-attr]
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("model server did not answer /health within 60 s")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

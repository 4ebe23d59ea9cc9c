"""Run the example model server for a test: in a thread of the test process (cheap: any
config, chaos included) or as its own process, the way users start it."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from examples.serving.model_server import ServerConfig, create_app
from tests.servers import free_port, http_process


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
    with http_process(
        [sys.executable, "-m", "examples.serving.model_server", "--port", str(port), *args],
        {**environ, **env},
        port=port,
        health="/health",
        what="model server",
    ) as base:
        yield base

"""The demo's embedded Vigil: the real app under uvicorn, on a thread of this process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from backend.api import create_app
from backend.migrate import upgrade
from backend.settings import Settings, load_settings


class DemoServerError(RuntimeError):
    pass


@dataclass
class DemoServer:
    settings: Settings
    base: str
    server: uvicorn.Server
    thread: threading.Thread

    def token(self, scope: str) -> str:
        return next(t for t, s in self.settings.bootstrap_tokens().items() if scope in s)

    def serve_until_interrupted(self) -> None:
        try:
            while self.thread.is_alive():
                self.thread.join(timeout=0.5)
        except KeyboardInterrupt:
            pass


@contextmanager
def embedded_server(*, database_url: str, port: int, **overrides: object) -> Iterator[DemoServer]:
    """Migrate, start Vigil embedded on ``port``, yield it, stop it."""
    if database_url.startswith("sqlite:///./"):
        Path(database_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    settings = load_settings(database_url=database_url, port=port, env="development", **overrides)
    upgrade(settings.database_url)
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host=settings.host, port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True, name="vigil-demo-server")
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise DemoServerError(f"the server did not start on port {port} (in use?)")
        time.sleep(0.05)
    try:
        yield DemoServer(settings, f"http://{settings.host}:{port}", server, thread)
    finally:
        server.should_exit = True
        thread.join(timeout=10)

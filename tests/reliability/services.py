"""Private services a test may restart or kill: ``redis-server`` and a PostgreSQL cluster,
each on a free port in a temporary directory (never the machine's shared ones).

    server = RedisServer(tmp_path); server.start()
    server.restart(down_s=1, kill=True)     # same port; contents lost (no persistence)
    pg = PostgresServer(); pg.start(); pg.create_database()
    pg.restart(immediate=True)              # a crash: WAL recovery on start
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.servers import free_port

REDIS_SERVER = shutil.which("redis-server")


def _pg_bindir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]))
    return Path(dirs[-1]) if dirs and (Path(dirs[-1]) / "initdb").exists() else None


PG_BIN = _pg_bindir()


def private_postgres_missing() -> str | None:
    """Why a private PostgreSQL cannot be started here, or None when it can."""
    if PG_BIN is None:
        return "needs the PostgreSQL server binaries (initdb, pg_ctl)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "as root, initdb needs `runuser` to run as the postgres user"
    return None


def wait_for(check, timeout: float, what: str, every: float = 0.1):  # type: ignore[no-untyped-def]
    """Poll ``check()`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except Exception:  # the thing polled may be down: that is what we wait out
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(every)


class RedisServer:
    """A private ``redis-server`` without persistence: a restart loses everything in it,
    as the compose file's Redis does."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert REDIS_SERVER is not None
        log = open(self.workdir / "redis.log", "ab")  # noqa: SIM115 (the process owns it)
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self.workdir)]
        self.proc = subprocess.Popen(
            [REDIS_SERVER, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        from redis import Redis

        client = Redis.from_url(self.url, socket_connect_timeout=1)
        wait_for(client.ping, 10, f"redis-server on port {self.port}")
        client.close()

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        self.proc.wait(timeout=10)
        self.proc = None

    def restart(self, down_s: float = 1.0, *, kill: bool = False) -> None:
        self.stop(kill=kill)
        time.sleep(down_s)
        self.start()


class PostgresServer:
    """A private PostgreSQL cluster (initdb in a temp dir, run as ``postgres`` when we are
    root, since initdb refuses root). ``restart(immediate=True)`` is a crash: WAL recovery."""

    def __init__(self) -> None:
        assert PG_BIN is not None
        self.dir = Path(tempfile.mkdtemp(prefix="vigil-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/vigil"
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.dir, "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run(
            [*self._as, str(PG_BIN / tool), *args], capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed: {done.stdout}{done.stderr}")

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=on -c full_page_writes=off -c max_connections=100"
        )
        log = str(self.dir / "postgres.log")  # not our pipes: pg_ctl would wait on them
        self._run(
            "pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", log, "-o", options
        )
        self._run("pg_ctl", "status", "-D", str(self.data))

    def stop(self, *, immediate: bool = False) -> None:
        mode = "immediate" if immediate else "fast"
        self._run("pg_ctl", "stop", "-w", "-m", mode, "-D", str(self.data))

    def restart(self, down_s: float = 1.0, *, immediate: bool = True) -> None:
        self.stop(immediate=immediate)
        time.sleep(down_s)
        self.start()

    def running(self) -> bool:
        try:
            self._run("pg_ctl", "status", "-D", str(self.data))
            return True
        except RuntimeError:
            return False

    def create_database(self) -> None:
        from sqlalchemy import create_engine, text

        admin = create_engine(self.url.rsplit("/", 1)[0] + "/postgres")
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("DROP DATABASE IF EXISTS vigil"))
            conn.execute(text("CREATE DATABASE vigil"))
        admin.dispose()

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.stop(immediate=True)
        shutil.rmtree(self.dir, ignore_errors=True)

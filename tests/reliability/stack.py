"""A live distributed (or embedded) Vigil as real processes, traffic that retries like the
collector, and what the tests read back (stored rows, incidents, metrics, logs).

    stack = VigilStack(tmp_path, db_url=url, redis_url=redis.url, VIGIL_DETECT_INTERVAL_S="1")
    stack.start_worker(); stack.start_beat(); stack.start_server()
    stack.kill9("worker")            # SIGKILL the worker and its pool children
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

import httpx

from backend.launch import kill_tree
from tests.conftest import ADMIN, INGEST
from tests.reliability.services import wait_for
from tests.servers import VIGIL, free_port, vigil_env


class VigilStack:
    """``vigil server`` / ``worker`` / ``beat`` processes, each killable and restartable.

    Output goes to files in ``workdir`` (a pipe nobody reads would block a chatty process);
    ``tail(name)`` shows it when a test fails.
    """

    def __init__(self, workdir: Path, *, db_url: str, redis_url: str | None, **env: str) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        extra = {"VIGIL_LOG_LEVEL": "INFO", **env}
        if redis_url:
            extra["VIGIL_REDIS_URL"] = redis_url
        self.env = vigil_env(db_url, **extra)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started = {"server": 0, "worker": 0, "beat": 0}

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        self.started[name] += 1
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 (the process owns it)
        log.write(f"\n==== {name} start #{self.started[name]} ====\n".encode())
        log.flush()
        proc = subprocess.Popen(
            [*VIGIL, *args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def start_server(self) -> subprocess.Popen[bytes]:
        proc = self._spawn("server", ["server", "--port", str(self.port), "--no-migrate"])

        def answers() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"vigil server exited:\n{self.tail('server')}")
            return httpx.get(f"{self.base}/healthz", timeout=1).is_success

        deadline = time.monotonic() + 60
        while True:
            try:
                if answers():
                    return proc
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"vigil server not answering /healthz:\n{self.tail('server')}")
            time.sleep(0.1)

    def start_worker(self, concurrency: int = 2) -> subprocess.Popen[bytes]:
        return self._spawn("worker", ["worker", "--concurrency", str(concurrency)])

    def start_beat(self) -> subprocess.Popen[bytes]:
        return self._spawn("beat", ["beat"])

    def alive(self, name: str) -> bool:
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    def kill9(self, name: str) -> None:
        """SIGKILL the process and every descendant (a prefork worker's pool too)."""
        proc = self.procs.pop(name)
        kill_tree(proc.pid)
        proc.wait(timeout=10)

    def ready(self) -> dict:
        reply = httpx.get(f"{self.base}/readyz", timeout=5)
        return {"status_code": reply.status_code, **reply.json()}

    def wait_ready(self, timeout: float = 60) -> dict:
        try:
            return wait_for(
                lambda: (r := self.ready())["status_code"] == 200 and r, timeout, "/readyz 200"
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last answer: {self._last_ready()}") from None

    def _last_ready(self) -> object:
        try:
            return self.ready()
        except Exception as exc:
            return exc

    def ingest(self, body: dict) -> httpx.Response:
        return httpx.post(f"{self.base}/api/v1/ingest", json=body, headers=INGEST, timeout=30)

    def tail(self, name: str, lines: int = 60) -> str:
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return "(no output)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        for name in list(self.procs):
            proc = self.procs.pop(name)
            if proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
            kill_tree(proc.pid)
            proc.wait()


# -- traffic and what it left behind ----------------------------------------------------------


class Traffic:
    """A collector-like sender on a thread: one-step batches for ``ranks`` ranks, each sent
    until the server acknowledges it (the same ``batch_id`` on every try, as the collector
    does), so every step it counts as acknowledged must be stored exactly once.

        with Traffic(stack.base, job="steady") as traffic:
            ...                                 # inject faults meanwhile
        assert traffic.acked == rows_stored
    """

    def __init__(self, base: str, *, job: str, ranks: int = 2, every_s: float = 0.05) -> None:
        import threading

        self.base, self.job, self.ranks, self.every_s = base, job, ranks, every_s
        self.acked = 0  # steps acknowledged (one step per batch)
        self.retries = 0  # tries that got no 200 (refused, 5xx, timeout)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from tests.factories import batch

        step = 0
        with httpx.Client(timeout=5) as client:
            while not self._stop.is_set():
                for rank in range(self.ranks):
                    event = {"type": "step", "step": step, "ts": time.time(), "duration_s": 0.5}
                    body = batch(
                        [{**event, "comm_s": 0.1, "loss": 2.0}],
                        job=self.job,
                        rank=rank,
                        world_size=self.ranks,
                    )
                    while True:  # until acknowledged, even while we are asked to stop
                        try:
                            reply = client.post(
                                f"{self.base}/api/v1/ingest", json=body, headers=INGEST
                            )
                            if reply.status_code == 200:
                                break
                        except httpx.TransportError:
                            pass
                        self.retries += 1
                        time.sleep(0.1)
                    self.acked += 1
                step += 1
                self._stop.wait(self.every_s)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        assert not self._thread.is_alive(), "traffic: a batch was never acknowledged"


def stored_steps(db_url: str, job: str) -> list[tuple[int, int]]:
    """``(rank, step)`` of every step row stored for ``job`` (duplicates included)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT s.rank, s.step FROM steps s JOIN jobs j ON j.id = s.job_id "
                    "WHERE j.name = :job"
                ),
                {"job": job},
            )
            return [(int(r), int(s)) for r, s in rows]
    finally:
        engine.dispose()


def straggler_batches(job: str, *, ranks: int = 4, steps: int = 120) -> list[dict]:
    """One batch per rank: ``steps`` steps that ended just now, rank 2 computing 1.5x from
    step 30 on (the detectors compare compute time = step time - collective wait)."""
    from tests.factories import batch

    now = time.time()
    out = []
    for rank in range(ranks):
        events = []
        for n in range(steps):
            compute = 0.3 * (1 + 0.01 * ((n * 7 + rank * 3) % 5 - 2))
            if rank == 2 and n >= 30:
                compute *= 1.5
            ts = now - 0.05 * (steps - 1 - n)
            events.append(
                {
                    "type": "step",
                    "step": n,
                    "ts": ts,
                    "duration_s": 0.5,
                    "comm_s": 0.5 - compute,
                    "loss": 2.0,
                }
            )
        events.append({"type": "heartbeat", "ts": now, "step": steps})
        out.append(batch(events, job=job, rank=rank, world_size=ranks))
    return out


def metric(base: str, name: str) -> float | None:
    """The value of an unlabelled sample in ``GET /metrics``."""
    for line in httpx.get(f"{base}/metrics", headers=ADMIN, timeout=10).text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return None


def straggler_incidents(base: str, job: str) -> list[dict]:
    reply = httpx.get(f"{base}/api/v1/jobs/{job}/incidents", headers=ADMIN, timeout=10)
    return [i for i in reply.json() if i["kind"] == "straggler"] if reply.is_success else []


def wait_log(stack: VigilStack, name: str, needle: str, timeout: float, after: int = 0) -> None:
    """Wait until ``needle`` shows in the process's log after byte ``after``."""
    path = stack.workdir / f"{name}.log"
    wait_for(
        lambda: needle in path.read_bytes()[after:].decode(errors="replace"),
        timeout,
        f"{name} log saying {needle!r}:\n{stack.tail(name)}",
    )


def log_size(stack: VigilStack, name: str) -> int:
    path = stack.workdir / f"{name}.log"
    return path.stat().st_size if path.exists() else 0

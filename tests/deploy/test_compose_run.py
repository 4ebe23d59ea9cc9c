"""``docker-compose.yml`` started as Compose would start it, as local processes: each Vigil
service's command and environment (resolved with ``.env.example``, secrets filled in),
against the CI PostgreSQL and Redis in place of the file's ``postgres`` and ``redis``
services. ``migrate`` must exit 0, then ``api``, ``worker`` and ``beat`` must come up,
``/readyz`` must say ready, their healthchecks must pass, an ingest with the documented
ingest token must be accepted and the worker must detect a straggler in it.

Skipped, visibly, without ``VIGIL_TEST_DATABASE_URL`` and ``VIGIL_TEST_REDIS_URL``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import make_url

from backend.launch import kill_tree
from backend.settings import DEV_INGEST_TOKEN, Settings
from tests.conftest import postgres_sibling, reset_postgres
from tests.deploy.compose import (
    VIGIL_SERVICES,
    container_ports,
    environment,
    load_compose,
    local_argv,
    resolve,
)
from tests.deploy.test_compose_file import filled_example
from tests.reliability.services import wait_for
from tests.reliability.stack import straggler_batches
from tests.servers import free_port

PG_URL = os.environ.get("VIGIL_TEST_DATABASE_URL")
REDIS_URL = os.environ.get("VIGIL_TEST_REDIS_URL")


def _point_at(url: str, service: str, services: dict[str, Any], test_url: str) -> str:
    """The test's URL in place of ``url``, after checking ``url`` reaches the file's own
    ``service`` (its host name, and for PostgreSQL the credentials the service is given)."""
    parsed = make_url(url)
    assert parsed.host == service and service in services, f"{url} is not the {service} service"
    if service == "postgres":
        pg = environment(services["postgres"])
        assert parsed.username == pg["POSTGRES_USER"]
        assert parsed.password == pg["POSTGRES_PASSWORD"]
        assert parsed.database == pg["POSTGRES_DB"]
    return test_url


class LocalCompose:
    """The Vigil services as processes; output in ``workdir/<service>.log``."""

    def __init__(self, workdir: Path, services: dict[str, Any], db_url: str, redis_url: str):
        self.workdir, self.services = workdir, services
        self.ports: dict[str, dict[str, str]] = {}
        self.envs: dict[str, dict[str, str]] = {}
        tmp = workdir / "tmp"  # each container has its own /tmp (beat keeps its schedule there)
        tmp.mkdir()
        base = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
        for name in VIGIL_SERVICES:
            env = environment(services[name])
            env["VIGIL_DATABASE_URL"] = _point_at(
                env["VIGIL_DATABASE_URL"], "postgres", services, db_url
            )
            env["VIGIL_REDIS_URL"] = _point_at(env["VIGIL_REDIS_URL"], "redis", services, redis_url)
            self.envs[name] = {**base, "TMPDIR": str(tmp), **env}
            self.ports[name] = {p: str(free_port()) for p in container_ports(services[name])}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def argv(self, name: str, command: list[str]) -> list[str]:
        return local_argv(command, self.ports[name])

    def run(self, name: str) -> subprocess.CompletedProcess[str]:
        """A one-shot service (``migrate``), to its exit."""
        return self.exec(name, self.services[name]["command"], timeout=120)

    def exec(
        self, name: str, command: list[str], timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """``docker compose exec <name> <command>``: another command, the service's env."""
        return subprocess.run(
            self.argv(name, command),
            env=self.envs[name],
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, name: str) -> None:
        with open(self.workdir / f"{name}.log", "wb") as log:  # the child keeps its copy
            self.procs[name] = subprocess.Popen(
                self.argv(name, self.services[name]["command"]),
                env=self.envs[name],
                cwd=self.workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def healthcheck(self, name: str) -> subprocess.CompletedProcess[str]:
        """The service's ``CMD`` healthcheck, run as Docker would run it in the container."""
        test = self.services[name]["healthcheck"]["test"]
        assert test[0] == "CMD", test
        return self.exec(name, test[1:], timeout=30)

    def logs(self) -> str:
        out = []
        for name in self.procs:
            path = self.workdir / f"{name}.log"
            tail = path.read_text(errors="replace").splitlines()[-30:] if path.exists() else []
            out.append(f"---- {name} (exit {self.procs[name].poll()}) ----\n" + "\n".join(tail))
        return "\n".join(out)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            kill_tree(proc.pid)
            proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_compose_services_start_and_detect(tmp_path: Path):
    if not (PG_URL and REDIS_URL):
        pytest.skip("runs the compose services: needs VIGIL_TEST_DATABASE_URL and _REDIS_URL")
    from redis import Redis

    db_url = postgres_sibling(Settings(database_url=PG_URL).database_url, "compose")
    reset_postgres(db_url)  # empty: `migrate` has to create the schema
    client = Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    client.flushdb()  # no heartbeats left by another test's workers
    client.close()

    env = filled_example()
    services = resolve(load_compose(), env)["services"]
    stack = LocalCompose(tmp_path, services, db_url, REDIS_URL)
    migrated = stack.run("migrate")
    assert migrated.returncode == 0, f"migrate exited {migrated.returncode}:\n{migrated.stderr}"
    try:
        for name in ("api", "worker", "beat"):
            stack.start(name)
        base = f"http://127.0.0.1:{stack.ports['api']['8000']}"

        def ready() -> bool:
            dead = [n for n, p in stack.procs.items() if p.poll() is not None]
            assert not dead, f"{dead} exited:\n{stack.logs()}"
            return httpx.get(f"{base}/readyz", timeout=5).status_code == 200

        try:
            wait_for(ready, 60, "/readyz 200 (api, a worker and beat alive)", every=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{stack.logs()}") from None
        for name in ("api", "worker", "beat"):
            check = stack.healthcheck(name)
            assert check.returncode == 0, f"{name} healthcheck: {check.stdout}{check.stderr}"

        ingest = {"Authorization": f"Bearer {env['VIGIL_INGEST_TOKEN']}"}
        admin = {"Authorization": f"Bearer {env['VIGIL_ADMIN_TOKEN']}"}
        bodies = straggler_batches("compose-smoke")
        dev_token = {"Authorization": f"Bearer {DEV_INGEST_TOKEN}"}  # production: refused
        refused = httpx.post(f"{base}/api/v1/ingest", json=bodies[0], headers=dev_token)
        assert refused.status_code == 401
        for body in bodies:
            reply = httpx.post(f"{base}/api/v1/ingest", json=body, headers=ingest, timeout=30)
            assert reply.status_code == 200, reply.text

        def straggler() -> list[dict[str, Any]]:
            url = f"{base}/api/v1/jobs/compose-smoke/incidents"
            found = httpx.get(url, headers=admin, timeout=10).json()
            return [i for i in found if i["kind"] == "straggler"]

        try:
            found = wait_for(straggler, 60, "a straggler incident from the worker", every=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{stack.logs()}") from None
        assert 2 in found[0]["ranks"], found

        # README's other ways to a collector token: `docker compose exec api vigil token
        # create --scope ingest …` (the api's environment) and POST /api/v1/tokens.
        made = stack.exec("api", ["vigil", "token", "create", "--scope", "ingest", "-n", "t"])
        assert made.returncode == 0, made.stderr
        posted = httpx.post(
            f"{base}/api/v1/tokens", json={"name": "u", "scopes": ["ingest"]}, headers=admin
        )
        assert posted.status_code == 201, posted.text
        for token in (made.stdout.strip(), posted.json()["token"]):
            beat = straggler_batches("compose-tokens", ranks=1, steps=1)[0]
            reply = httpx.post(
                f"{base}/api/v1/ingest", json=beat, headers={"Authorization": f"Bearer {token}"}
            )
            assert reply.status_code == 200, reply.text
    finally:
        stack.stop()

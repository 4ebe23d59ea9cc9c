"""``vigil import flight-recorder``: the dumps go to a running server over REST, and a local
import (``--local``) on a fresh database migrates it or says in one line what to run; never
a traceback, never a write into a database file nobody serves."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.conftest import ADMIN, backend_url
from tests.servers import free_port, live_server, run_vigil, vigil_env

LOCK_GIL = Path(__file__).parents[2] / "data" / "flight_recorder" / "lock_gil_1st"
JOB = "megatron-moe"


def _import(*extra: str, env: dict[str, str]) -> tuple[int, str, str]:
    result = run_vigil(["import", "flight-recorder", str(LOCK_GIL), "--job", JOB, *extra], env)
    return result.returncode, result.stdout, result.stderr


def _hangs(base: str) -> list[tuple[str, list[int]]]:
    found = httpx.get(f"{base}/api/v1/jobs/{JOB}/incidents", headers=ADMIN).json()
    return [(i["kind"], i["ranks"]) for i in found]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_imports_the_real_dumps_into_a_running_server(
    kind: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    url = backend_url(kind, tmp_path_factory, suffix="import")
    # The importing shell's own database setting points at a file no server uses.
    local = tmp_path / "local.db"
    env = vigil_env(f"sqlite:///{local}")
    with live_server(url) as base:
        rc, out, err = _import("--endpoint", base, "--token", "vigil-dev-ingest", env=env)
        assert rc == 0, err
        assert "Culprit ranks: 9, 14" in out
        assert "stored as hang incident" in out and "on " + base in out
        assert _hangs(base) == [("hang", [9, 14])]
        # Again, from VIGIL_ENDPOINT / VIGIL_TOKEN: the same incident, not a second one.
        rc, out, err = _import(
            env={**env, "VIGIL_ENDPOINT": base, "VIGIL_TOKEN": "vigil-dev-admin"}
        )
        assert rc == 0, err
        assert _hangs(base) == [("hang", [9, 14])]
        # A read-only token is refused, in one line naming the scope.
        created = run_vigil(["token", "create", "-s", "read", "-n", "viewer"], vigil_env(url))
        reader = created.stdout.strip()
        rc, out, err = _import("--endpoint", base, "--token", reader, env=env)
        assert rc == 1 and "ingest" in err and "Traceback" not in err
    assert not local.exists()


def test_without_a_server_it_says_so_in_one_line(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh.db"
    env = vigil_env(f"sqlite:///{fresh}", VIGIL_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    rc, _, err = _import(env=env)
    assert rc == 1
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "cannot reach" in err and "--local" in err
    assert not fresh.exists()  # nothing written anywhere


def test_local_import_migrates_a_fresh_sqlite_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    rc, out, err = _import("--local", env=vigil_env(url))
    assert rc == 0, err
    assert "Culprit ranks: 9, 14" in out and "stored as hang incident" in out
    with live_server(url) as base:
        assert _hangs(base) == [("hang", [9, 14])]


def test_local_import_into_an_unmigrated_postgres_says_what_to_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    url = backend_url("postgres", tmp_path_factory, suffix="import_local")
    rc, _, err = _import("--local", env=vigil_env(url))
    assert rc == 1
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "vigil migrate" in err

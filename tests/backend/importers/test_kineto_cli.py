"""``vigil import kineto``: real profiler traces read by the CLI and sent to a running server
over REST (or written with ``--local``); several ranks' files make one multi-rank job; a bad
file is one line on stderr naming it, and nothing is stored anywhere."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from backend.db import make_engine
from backend.telemetry.models import StepRecord
from tests.conftest import ADMIN, backend_url
from tests.servers import free_port, live_server, run_vigil, vigil_env

DATA = Path(__file__).parents[2] / "data" / "kineto"
HTA_RANK0 = DATA / "sampled_rank-0.json.gz"
GLOO = DATA / "gloo_ddp_2ranks"


def _import(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    result = run_vigil(["import", "kineto", *args], env)
    return result.returncode, result.stdout, result.stderr


def _steps(base: str, job: str) -> list[tuple[int, int]]:
    reply = httpx.get(f"{base}/api/v1/jobs/{job}/steps", headers=ADMIN)
    if reply.status_code == 404:
        return []
    return [(s["rank"], s["step"]) for s in reply.json()["items"]]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_imports_real_traces_into_a_running_server(
    kind: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    url = backend_url(kind, tmp_path_factory, suffix="kineto")
    local = tmp_path / "local.db"
    env = vigil_env(f"sqlite:///{local}")
    with live_server(url) as base:
        auth = ("--endpoint", base, "--token", "vigil-dev-ingest")
        rc, out, err = _import(str(HTA_RANK0), "--job", "pyper", *auth, env=env)
        assert rc == 0, err
        assert "rank 0 (sampled_rank-0.json.gz): 2 iterations" in out
        # The breakdown as HTA computes it: iteration 551, GPU span 600.1 ms, idle 321.4 ms.
        assert any(
            line.split()[:2] == ["0", "551"] and "321.4" in line for line in out.splitlines()
        )
        assert "stored 2 iterations of rank(s) 0 as job 'pyper'" in out
        assert _steps(base, "pyper") == [(0, 551), (0, 552)]

        # Two ranks' files, given as their folder: one two-rank job.
        rc, out, err = _import(str(GLOO), "--job", "ddp", *auth, env=env)
        assert rc == 0, err
        assert sorted(_steps(base, "ddp")) == [(r, s) for r in (0, 1) for s in (2, 3, 4)]
        job = httpx.get(f"{base}/api/v1/jobs/ddp", headers=ADMIN).json()
        assert job["world_size"] == 2

        # Again, from VIGIL_ENDPOINT / VIGIL_TOKEN: stored once.
        again = {**env, "VIGIL_ENDPOINT": base, "VIGIL_TOKEN": "vigil-dev-ingest"}
        rc, out, err = _import(str(GLOO), "--job", "ddp", env=again)
        assert rc == 0 and "(0, 1 stored before: kept once)" in out, err
        assert len(_steps(base, "ddp")) == 6
    assert not local.exists()


def test_a_bad_file_is_one_line_and_nothing_is_sent(tmp_path: Path) -> None:
    bad = tmp_path / "rank-1.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": "ProfilerStep#1", "ts": 1, "dur": ')
    fresh = tmp_path / "fresh.db"
    # No server listens there: a file refused before sending exits 2, not 1 (unreachable).
    env = vigil_env(f"sqlite:///{fresh}", VIGIL_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    # The good file goes with the bad one: neither is sent.
    rc, _, err = _import(str(GLOO / "rank-0.json.gz"), str(bad), "--job", "ddp", env=env)
    assert rc == 2
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert str(bad) in err and "not valid JSON" in err
    rc, _, err = _import(str(tmp_path / "gone.json.gz"), "--job", "ddp", "--local", env=env)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "gone.json.gz: cannot read" in err
    assert not fresh.exists() or not _local_steps(fresh)


def test_without_a_server_it_says_so_in_one_line(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh.db"
    env = vigil_env(f"sqlite:///{fresh}", VIGIL_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    rc, _, err = _import(str(GLOO), "--job", "ddp", env=env)
    assert rc == 1
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "cannot reach" in err and "--local" in err
    assert not fresh.exists()


def _local_steps(db: Path) -> list[tuple[int, int]]:
    engine = make_engine(f"sqlite:///{db}")
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(StepRecord.rank, StepRecord.step).order_by(StepRecord.step))
            return [(r, s) for r, s in rows]
    finally:
        engine.dispose()


def test_local_import_with_a_given_rank(tmp_path: Path) -> None:
    db = tmp_path / "fresh.db"
    one = GLOO / "rank-1.json.gz"
    env = vigil_env(f"sqlite:///{db}")
    rc, out, err = _import(str(one), "--job", "ddp", "--rank", "1", "--local", env=env)
    assert rc == 0, err
    assert "stored 3 iterations of rank(s) 1 as job 'ddp' in the local database" in out
    assert _local_steps(db) == [(1, 2), (1, 3), (1, 4)]

"""The `vigil` command, run as a real process."""

from __future__ import annotations

import os

import httpx
import pytest
from sqlalchemy import func, select

from backend.actions.models import Action
from backend.audit.models import AuditEntry
from backend.db import make_engine
from backend.demo.story import FAST
from backend.telemetry.models import JobEvent, StepRecord
from tests.conftest import ADMIN, INGEST
from tests.factories import batch, step
from tests.servers import free_port, live_server, run_vigil, vigil_env


def test_migrate_then_tokens(sqlite_url):
    env = vigil_env(sqlite_url)
    migrated = run_vigil(["migrate"], env)
    assert migrated.returncode == 0, migrated.stderr
    assert "database at revision" in migrated.stdout

    created = run_vigil(
        ["token", "create", "--scope", "read", "--scope", "ingest", "-n", "ci"], env
    )
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip()
    assert secret.startswith("vgl_")
    assert "not shown again" in created.stderr

    listed = run_vigil(["token", "list"], env)
    assert "ci" in listed.stdout and "ingest read" in listed.stdout
    assert secret not in listed.stdout

    assert run_vigil(["token", "revoke", "1"], env).returncode == 0
    missing = run_vigil(["token", "revoke", "99"], env)
    assert missing.returncode == 1 and "no token with id 99" in missing.stderr

    bad = run_vigil(["token", "create", "--scope", "root"], env)
    assert bad.returncode == 2 and "scopes must be" in bad.stderr


def test_bad_setting_stops_the_server_with_a_clear_message(sqlite_url):
    result = run_vigil(["server"], vigil_env("mysql://db/x"))
    assert result.returncode == 2
    assert "VIGIL_DATABASE_URL: unsupported database 'mysql'" in result.stderr


def test_server_refuses_an_unmigrated_postgres(tmp_path_factory):
    from tests.conftest import backend_url

    url = backend_url("postgres", tmp_path_factory, suffix="cli")
    result = run_vigil(["server", "--port", str(free_port())], vigil_env(url), timeout=60)
    assert result.returncode == 1
    assert "run `vigil migrate` first" in result.stderr


def test_server_answers_healthz_ingests_and_lists_jobs(sqlite_url):
    with live_server(sqlite_url) as base:
        assert httpx.get(f"{base}/healthz").json()["status"] == "ok"
        reply = httpx.post(f"{base}/api/v1/ingest", json=batch([step(1), step(2)]), headers=INGEST)
        assert reply.json()["accepted"] == 2
        jobs = run_vigil(["jobs", "--endpoint", base], vigil_env(sqlite_url))
        assert jobs.returncode == 0, jobs.stderr
        assert "llama-8b-pretrain" in jobs.stdout
        page = httpx.get(f"{base}/", headers=ADMIN).text
        assert "llama-8b-pretrain" in page


def test_jobs_reports_an_unreachable_server(sqlite_url):
    result = run_vigil(
        ["jobs", "--endpoint", f"http://127.0.0.1:{free_port()}"], vigil_env(sqlite_url)
    )
    assert result.returncode == 1
    assert "cannot reach" in result.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_demo_fast_diagnoses_and_heals_a_real_faulty_job(tmp_path):
    """README's first command, fast: a real 4-rank gloo job with a straggler, a NaN and a
    hang; the summary must show each flagged with the right ranks and the job finished."""
    pytest.importorskip("torch")
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    result = run_vigil(
        ["demo", "--fast", "--port", str(free_port()), "--database", url],
        vigil_env(url),
        cwd=tmp_path,
        timeout=280,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "every fault flagged with the right ranks; the job finished" in out
    for row in ("straggler: rank 2", "nan: NaN loss", "hang: rank 1"):
        line = next(line for line in out.splitlines() if row in line)
        assert "✓" in line and "yes" in line, line
    assert "rollback succeeded" in out and "restart succeeded" in out
    # The job said how long it is, so no recovery estimate assumed a horizon.
    engine = make_engine(url)
    with engine.connect() as conn:
        plans = conn.scalars(select(JobEvent.attrs).where(JobEvent.name == "run_plan")).all()
        decided = [
            *conn.scalars(select(Action.reasoning)),
            *conn.scalars(select(AuditEntry.detail)),
        ]
    engine.dispose()
    assert plans and all(p["total_steps"] == FAST.steps for p in plans)
    horizons = [r["horizon"] for r in decided if r and "horizon" in r]
    horizons += [
        r["reasoning"]["horizon"] for r in decided if r and "horizon" in r.get("reasoning", {})
    ]
    assert horizons and all("planned steps" in h for h in horizons), horizons


def test_demo_fast_replays_the_real_pai_job(tmp_path):
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    result = run_vigil(
        ["demo", "--fast", "--replay", "--port", str(free_port()), "--database", url],
        vigil_env(url),
        cwd=tmp_path,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "pai-job-1" in result.stdout
    assert "10/10 ranks" in result.stdout
    engine = make_engine(url)
    with engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(StepRecord)) == 3000
        # Worker 6 is the straggler of iterations 1800-2000 in the real trace.
        slowest = conn.execute(
            select(StepRecord.rank)
            .where(StepRecord.step.between(1800, 2000))
            .group_by(StepRecord.rank)
            .order_by(func.avg(StepRecord.duration_s).desc())
            .limit(1)
        ).scalar()
    engine.dispose()
    assert slowest == 6


def test_import_flight_recorder_stores_a_hang_naming_ranks_9_and_14(sqlite_url, tmp_path):
    from pathlib import Path

    dumps = Path(__file__).resolve().parents[1] / "data" / "flight_recorder" / "lock_gil_1st"
    env = vigil_env(sqlite_url)
    assert run_vigil(["migrate"], env).returncode == 0
    args = ["import", "flight-recorder", str(dumps), "--job", "megatron-moe", "--local"]
    result = run_vigil(args, env)
    assert result.returncode == 0, result.stderr
    assert "Culprit ranks: 9, 14" in result.stdout
    assert "stored as hang incident" in result.stdout
    again = run_vigil(args, env)
    assert again.returncode == 0
    with live_server(sqlite_url) as base:
        found = httpx.get(f"{base}/api/v1/jobs/megatron-moe/incidents", headers=ADMIN).json()
    assert [(i["kind"], i["ranks"]) for i in found] == [("hang", [9, 14])]  # imported once


def test_import_refuses_a_malicious_dump(sqlite_url, tmp_path):
    import pickle

    class Exploit:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    (tmp_path / "dumps").mkdir()
    (tmp_path / "dumps" / "_dump_0").write_bytes(pickle.dumps(Exploit()))
    env = vigil_env(sqlite_url)
    run_vigil(["migrate"], env)
    result = run_vigil(["import", "flight-recorder", str(tmp_path / "dumps"), "--job", "x"], env)
    assert result.returncode == 2
    assert "_dump_0" in result.stderr
    assert not (tmp_path / "pwned").exists()

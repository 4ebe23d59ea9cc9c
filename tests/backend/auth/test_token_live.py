"""A token made with ``vigil token create`` works at once on a real ``vigil server``.

On SQLite the token lookup used to open a second write transaction while the request's
own write transaction held the lock: the first use of a new token on a write route waited
out the 30 s busy timeout and answered 500.
"""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import INGEST
from tests.factories import batch, step
from tests.servers import live_server, run_vigil, vigil_env


@pytest.mark.timeout(120)
def test_a_new_cli_token_works_on_a_write_route_at_once(sqlite_url):
    with live_server(sqlite_url) as base:
        made = run_vigil(
            ["token", "create", "--scope", "admin", "--name", "oncall"], vigil_env(sqlite_url)
        )
        assert made.returncode == 0, made.stderr
        token = made.stdout.strip().splitlines()[-1]
        assert token.startswith("vgl_")
        reply = httpx.post(f"{base}/api/v1/ingest", json=batch([step(1)]), headers=INGEST)
        assert reply.status_code == 200
        # Well under the 30 s SQLite busy timeout the old lookup waited out.
        reply = httpx.post(
            f"{base}/api/v1/jobs/llama-8b-pretrain/actions",
            json={"kind": "dump_stacks", "reason": "first use of a new token"},
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert reply.status_code == 201, reply.text
        assert reply.json()["requested_by"] == "api:oncall"
        listed = httpx.get(f"{base}/api/v1/tokens", headers={"Authorization": f"Bearer {token}"})
        assert listed.status_code == 200
        assert listed.json()[0]["last_used_at"] is not None  # recorded, off the hot path

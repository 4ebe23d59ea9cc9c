"""Fuzz the whole REST API against its own OpenAPI document (schemathesis, pinned).

A live ``vigil server`` per database (SQLite, PostgreSQL) with some data in it (a training
job with a NaN loss, a serving job with an SLO, a webhook receiver, an action); then
schemathesis runs its examples, coverage and fuzzing phases over every operation with the
admin token (which has the ``ingest`` scope too), from a fixed seed and with a bounded
number of cases per operation, and checks each answer:

- ``not_a_server_error``: no 5xx, whatever was sent;
- ``status_code_conformance``: the status is one the operation documents;
- ``response_schema_conformance``: the body matches the documented schema;
- ``content_type_conformance``: so does the media type;
- ``unsupported_method`` / ``allow_header_conformance``: a method a path does not have is
  405 with an ``Allow`` that names exactly the documented ones (so does ``OPTIONS``);
- ``negative_data_rejection``: what the schema forbids (``true`` for an integer, a string
  for a number, a value out of range) is refused with a 4xx, not taken.

Webhook receivers it registers point at 127.0.0.1 only: generated ``url`` fields are drawn
from loopback URLs, and the server runs with ``VIGIL_WEBHOOK_HOSTS=127.0.0.1``, so even a
URL generated past that (coverage cases) is never sent to; the test checks both.

To replay a failure: the output names each case with a ``curl`` line and the seed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import ADMIN, INGEST, backend_url
from tests.factories import batch, every_event_type, step
from tests.servers import live_server

pytest.importorskip("schemathesis", reason="the fuzz needs the dev extra (schemathesis)")

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
HOOKS = Path(__file__).with_name("fuzz_hooks.py")  # how to send application/x-ndjson
SEED = 1324
MAX_EXAMPLES = 20  # per operation and phase: the whole run stays about a minute per database
CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "response_schema_conformance",
        "content_type_conformance",
        "unsupported_method",
        "allow_header_conformance",
        "negative_data_rejection",
    ]
)
TRAINING, SERVING = "llama-8b-pretrain", "chat-prod"
LOOPBACK = ["http://127.0.0.1:9/hook", "http://127.0.0.1:1/alerts?k=v"]

CONFIG = f"""
seed = {SEED}
workers = 1
request-timeout = 30

[generation]
max-examples = {MAX_EXAMPLES}

[dictionaries.jobs]
values = ["{TRAINING}", "{SERVING}"]

[dictionaries.ids]
values = [1, 2]

[dictionaries.loopback]
values = {json.dumps(LOOPBACK)}

[parameters]
"path.job" = {{ dictionary = "jobs", probability = 0.5 }}
"path.receiver_id" = {{ dictionary = "ids", probability = 0.5 }}
"path.slo_id" = {{ dictionary = "ids", probability = 0.5 }}
"path.action_id" = {{ dictionary = "ids", probability = 0.5 }}
"path.incident_id" = {{ dictionary = "ids", probability = 0.5 }}
"body.url" = {{ dictionary = "loopback" }}
"""


def seed_data(base: str) -> None:
    """Something for the read operations to return, including what is hard to encode."""

    def ok(reply: httpx.Response) -> None:
        assert reply.status_code < 300, reply.text

    training = [step(n, loss=float("nan") if n == 5 else 2.0) for n in range(1, 12)]
    body = json.dumps(batch([*training, *every_event_type()], job=TRAINING))  # NaN literal
    headers = {**INGEST, "Content-Type": "application/json"}
    ok(httpx.post(f"{base}/api/v1/ingest", content=body, headers=headers, timeout=30))
    requests = [
        {"type": "request", "id": f"r-{i}", "arrival": 1_732_233_000.0 + i,
         "first_token": 1_732_233_000.2 + i, "end": 1_732_233_001.0 + i,
         "prompt_tokens": 100, "output_tokens": 20, "status": "ok"}
        for i in range(10)
    ]  # fmt: skip
    serving = batch(requests, job=SERVING, kind="serving", batch_id=str(uuid.uuid4()))
    ok(httpx.post(f"{base}/api/v1/ingest", json=serving, headers=INGEST, timeout=30))
    slo = {"job": SERVING, "name": "interactive", "ttft_s": 0.5}
    ok(httpx.post(f"{base}/api/v1/slos", json=slo, headers=ADMIN, timeout=30))
    hook = {"name": "oncall", "url": LOOPBACK[0], "format": "generic"}
    ok(httpx.post(f"{base}/api/v1/webhooks", json=hook, headers=ADMIN, timeout=30))
    action = {"kind": "dump_stacks", "reason": "fuzz"}
    ok(httpx.post(f"{base}/api/v1/jobs/{TRAINING}/actions", json=action, headers=ADMIN))


@pytest.fixture(params=["sqlite", "postgres"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    url = backend_url(request.param, tmp_path_factory, suffix="fuzz")
    with live_server(url, VIGIL_WEBHOOK_HOSTS="127.0.0.1") as base:
        seed_data(base)
        yield base


def nothing_sent_off_loopback(base: str) -> list[str]:
    """Deliveries that went (or may have gone) to a host other than 127.0.0.1."""
    leaks = []
    receivers = httpx.get(f"{base}/api/v1/webhooks", headers=ADMIN, timeout=30).json()
    for receiver in receivers:
        if urlsplit(receiver["url"]).hostname == "127.0.0.1":
            continue
        deliveries = httpx.get(
            f"{base}/api/v1/webhooks/{receiver['id']}/deliveries", headers=ADMIN, timeout=30
        ).json()
        for delivery in deliveries:
            if "not in VIGIL_WEBHOOK_HOSTS" not in (delivery["error"] or ""):
                leaks.append(f"{receiver['url']}: {delivery}")
    return leaks


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_api_keeps_to_its_openapi_document(server: str, tmp_path: Path) -> None:
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    run = subprocess.run(
        [str(SCHEMATHESIS), "--no-color", "--config-file", str(config), "run",
         f"{server}/openapi.json", "--checks", CHECKS,
         "--phases", "examples,coverage,fuzzing",
         "--header", f"Authorization: {ADMIN['Authorization']}"],
        capture_output=True, text=True, timeout=380, cwd=tmp_path,
        env={**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS)},
    )  # fmt: skip
    out = run.stdout + run.stderr
    (tmp_path / "schemathesis.txt").write_text(out)  # the whole report, kept with the test
    summary = out[out.rfind("SUMMARY") :] if "SUMMARY" in out else out[-3000:]
    assert run.returncode == 0, f"schemathesis found failures:\n{out[-30000:]}"
    generated = re.search(r"(\d+) generated", summary)
    assert "Tested: " in summary and generated and int(generated[1]) > 0, summary
    assert nothing_sent_off_loopback(server) == []

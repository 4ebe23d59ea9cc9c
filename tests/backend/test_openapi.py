"""The OpenAPI document says what the API sends and takes: the one error body for every
4xx, strict numbers (``true`` is no integer), NaN readings, and bounds on every number a
column must hold (what the fuzz, ``tests/reliability/test_fuzz.py``, found as 500s)."""

from __future__ import annotations

import json

import pytest

from tests.backend.test_errors import shape
from tests.conftest import ADMIN, INGEST
from tests.factories import batch, step

# --- the OpenAPI document says what is sent --------------------------------------------


@pytest.fixture
def openapi(client) -> dict:  # type: ignore[type-arg]
    return client.get("/openapi.json").json()


def resolve(spec: dict, schema: dict) -> dict:  # type: ignore[type-arg]
    """``schema`` with the document's components, ready for a JSON Schema validator."""
    return {**schema, "components": spec["components"]}


def test_every_api_operation_documents_the_error_shape(openapi):
    import jsonschema_rs

    for path, ops in openapi["paths"].items():
        if not path.startswith("/api/"):
            continue
        for method, op in ops.items():
            codes = set(op["responses"])
            assert {"401", "403", "422"} <= codes, (method, path, codes)
            if "requestBody" in op:
                assert {"400", "413"} <= codes, (method, path, codes)
            # A job's policies and imports take any job name (an import creates the job).
            any_job = (
                "/api/v1/jobs/{job}/policies",
                "/api/v1/jobs/{job}/imports/flight-recorder",
                "/api/v1/jobs/{job}/imports/kineto",
            )
            if "{" in path and method != "put" and path not in any_job:
                assert "404" in codes, (method, path, codes)
            for code, doc in op["responses"].items():
                if code.startswith("4"):
                    schema = doc["content"]["application/json"]["schema"]
                    validator = jsonschema_rs.validator_for(resolve(openapi, schema))
                    for sent in (
                        {"error": "invalid", "status": 422, "detail": "cursor: bad"},
                        {
                            "error": "invalid",
                            "status": 422,
                            "detail": [
                                {"field": "url", "msg": "m", "type": "t", "loc": ["body", "url"]}
                            ],
                        },
                        {
                            "error": "invalid",
                            "status": 422,
                            "detail": [{"field": "events[0].ts", "msg": "m", "type": "t"}],
                        },
                        {"error": "conflict", "status": 409, "detail": "x", "guards": []},
                    ):
                        assert validator.is_valid(sent), (method, path, code, sent)


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("post", "/api/v1/webhooks", {"name": "x", "url": "http://127.0.0.1:9/",
                                      "repeat_interval_s": True}, "repeat_interval_s"),
        ("put", "/api/v1/policies/hang", {"mode": "auto",
                                          "params": {"max_restarts_per_hour": True}},
         "params.max_restarts_per_hour"),
        ("post", "/api/v1/jobs/j/actions", {"kind": "restart", "target_ranks": [False]},
         "target_ranks[0]"),
        ("post", "/api/v1/slos", {"job": "j", "name": "n", "ttft_s": True}, "ttft_s"),
    ],
)  # fmt: skip
def test_true_is_not_a_number(client, method, path, body, field):
    reply = client.request(method, path, json=body, headers=ADMIN)
    detail = shape(reply, 422, "invalid")["detail"]
    assert [e["field"] for e in detail] == [field]


def test_a_nan_loss_is_sent_as_the_schema_says(client, openapi):
    import jsonschema_rs

    events = [step(1, loss=float("nan")), step(2, loss=float("inf"))]
    body = json.dumps(batch(events))  # NaN and Infinity literals, as Python's json writes
    headers = {**INGEST, "Content-Type": "application/json"}
    assert client.post("/api/v1/ingest", content=body, headers=headers).status_code == 200
    reply = client.get("/api/v1/jobs/llama-8b-pretrain/steps", headers=ADMIN)
    assert reply.status_code == 200
    losses = [item["loss"] for item in reply.json()["items"]]
    assert sorted(losses) == ["Infinity", "NaN"]  # the signal survives
    content = openapi["paths"]["/api/v1/jobs/{job}/steps"]["get"]["responses"]["200"]
    schema = resolve(openapi, content["content"]["application/json"]["schema"])
    errors = [e.message for e in jsonschema_rs.validator_for(schema).iter_errors(reply.json())]
    assert errors == []


@pytest.mark.parametrize(
    ("fields", "events", "field"),
    [
        ({"rank": True}, [step(1)], "rank"),
        ({"world_size": True}, [step(1)], "world_size"),
        ({}, [step(True)], "events[0].step"),
        ({}, [step(1, mem_bytes=False)], "events[0].mem_bytes"),
    ],
)
def test_ingest_takes_no_true_for_an_integer(client, fields, events, field):
    reply = client.post("/api/v1/ingest", json=batch(events, **fields), headers=INGEST)
    detail = shape(reply, 422, "invalid")["detail"]
    assert [e["field"] for e in detail] == [field]


# --- what the fuzz found: inputs that were 500s ------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", f"/api/v1/slos/{2**80}"),
        ("delete", f"/api/v1/webhooks/{2**40}"),
        ("delete", f"/api/v1/tokens/{2**48}"),
        ("get", f"/api/v1/incidents/{2**63}/evidence-chart"),
        ("get", f"/api/v1/jobs/llama-8b-pretrain/steps?rank={2**70}"),
        ("get", f"/api/v1/jobs/llama-8b-pretrain/heatmap?from_step={2**100}"),
        ("get", f"/api/v1/jobs/llama-8b-pretrain/audit?action_id={2**40}"),
        ("get", "/api/v1/jobs/chat-prod/slos?until=6e307"),
        ("get", "/api/v1/jobs/chat-prod/serving?since=1e300"),
    ],
)
def test_numbers_no_column_holds_are_422(client, method, path):
    assert client.post("/api/v1/ingest", json=batch([step(1)]), headers=INGEST).status_code == 200
    reply = client.request(method, path, headers=ADMIN)
    assert shape(reply, 422, "invalid")["detail"][0]["type"] == "less_than_equal"


def test_an_slo_patch_cannot_null_what_it_must_have_or_take_a_name_in_use(client):
    for name in ("a", "b"):
        made = client.post(
            "/api/v1/slos", json={"job": "j", "name": name, "ttft_s": 1.0}, headers=ADMIN
        )
        assert made.status_code == 201, made.text
    slo = made.json()["id"]
    reply = client.patch(f"/api/v1/slos/{slo}", json={"period_s": None}, headers=ADMIN)
    assert shape(reply, 422, "invalid")["detail"][0]["field"] == "period_s"
    reply = client.patch(f"/api/v1/slos/{slo}", json={"name": "a"}, headers=ADMIN)
    assert shape(reply, 409, "conflict")["detail"] == "job 'j' already has an SLO named 'a'"

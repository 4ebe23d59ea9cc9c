"""One error body for the REST API: ``{"error", "status", "detail", …extra}``, whatever
raised it (a domain error, auth, request validation, ingest's own checks, a bug)."""

from __future__ import annotations

import gzip
import json
import logging

import pytest
from fastapi import FastAPI, Response
from fastapi.testclient import TestClient

from backend.api import create_app
from backend.errors import (
    INTERNAL_DETAIL,
    Conflict,
    NotFound,
    code_for,
    error_body,
    error_response,
    field_path,
    install_error_handlers,
)
from tests.conftest import ADMIN, INGEST
from tests.factories import batch, step

KEYS = {"error", "status", "detail"}


def shape(reply, status: int, error: str) -> dict:  # type: ignore[no-untyped-def,type-arg]
    """The reply's body, after checking it has the one shape and the expected status."""
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/json"
    body = reply.json()
    assert set(body) == KEYS, body
    assert (body["error"], body["status"]) == (error, status)
    return body


# --- sources of errors in the real app ----------------------------------------------------


def test_domain_not_found_is_404(client):
    reply = client.get("/api/v1/jobs/nope", headers=ADMIN)
    assert shape(reply, 404, "not_found")["detail"] == "job 'nope' not found"


def test_unknown_api_path_is_404(client):
    reply = client.get("/api/v1/nothing-here", headers=ADMIN)
    assert shape(reply, 404, "not_found")["detail"] == "Not Found"


def test_missing_token_is_401_with_its_challenge(client):
    reply = client.get("/api/v1/jobs")
    body = shape(reply, 401, "unauthorized")
    assert body["detail"].startswith("missing bearer token")
    assert reply.headers["www-authenticate"] == "Bearer"


def test_token_without_the_scope_is_403(client):
    reply = client.get("/api/v1/jobs", headers=INGEST)
    assert "lacks the 'read' scope" in shape(reply, 403, "forbidden")["detail"]


def test_wrong_method_is_405_with_allow(client):
    reply = client.delete("/api/v1/jobs", headers=ADMIN)
    shape(reply, 405, "method_not_allowed")
    assert "GET" in reply.headers["allow"]


def test_query_parameter_validation_is_422_naming_the_field(client):
    reply = client.get("/api/v1/jobs/x/steps?limit=0&rank=-1", headers=ADMIN)
    detail = shape(reply, 422, "invalid")["detail"]
    assert {e["field"] for e in detail} == {"query.limit", "query.rank"}
    first = next(e for e in detail if e["field"] == "query.limit")
    assert set(first) == {"field", "msg", "type", "loc"}
    assert first["loc"] == ["query", "limit"] and first["type"] == "greater_than_equal"


def test_body_validation_is_422_without_the_body_prefix(client):
    reply = client.post("/api/v1/webhooks", json={"name": "x", "url": 7}, headers=ADMIN)
    detail = shape(reply, 422, "invalid")["detail"]
    assert [e["field"] for e in detail] == ["url"]
    assert detail[0]["loc"] == ["body", "url"]


def test_domain_invalid_is_422_with_a_string(client):
    reply = client.get("/api/v1/jobs/x/steps?cursor=bogus", headers=ADMIN)
    assert shape(reply, 422, "invalid")["detail"].startswith("cursor: ")


def test_ingest_field_validation_is_422_naming_the_field(client):
    reply = client.post("/api/v1/ingest", json=batch([step(1, duration_s=-1)]), headers=INGEST)
    detail = shape(reply, 422, "invalid")["detail"]
    assert detail[0]["field"] == "events[0].duration_s"
    assert set(detail[0]) == {"field", "msg", "type"}


def test_ingest_bad_json_is_400(client):
    reply = client.post(
        "/api/v1/ingest",
        content=b"{not json",
        headers={**INGEST, "Content-Type": "application/json"},
    )
    assert shape(reply, 400, "bad_request")["detail"].startswith("body is not valid JSON")


def test_ingest_media_type_is_415(client):
    reply = client.post(
        "/api/v1/ingest", content=b"x", headers={**INGEST, "Content-Type": "text/plain"}
    )
    detail = shape(reply, 415, "unsupported_media_type")["detail"]
    assert "content-type must be application/json" in detail


@pytest.fixture
def small_app(settings, engine, session_factory):  # type: ignore[no-untyped-def]
    limited = settings.model_copy(update={"max_body_bytes": 4096, "max_inflight_ingest": 1})
    return create_app(limited, engine=engine, session_factory=session_factory)


def test_ingest_too_large_is_413(small_app):
    packed = gzip.compress(json.dumps(batch([step(n) for n in range(200)])).encode())
    headers = {**INGEST, "Content-Type": "application/json", "Content-Encoding": "gzip"}
    with TestClient(small_app) as client:
        reply = client.post("/api/v1/ingest", content=packed, headers=headers)
    assert "decompressed body exceeds" in shape(reply, 413, "too_large")["detail"]


def test_ingest_saturated_is_429_with_retry_after(small_app):
    gate = small_app.state.ingest_gate
    assert gate.try_enter()  # the one slot is taken
    try:
        with TestClient(small_app) as client:
            reply = client.post("/api/v1/ingest", json=batch([step(1)]), headers=INGEST)
    finally:
        gate.leave()
    assert "server saturated" in shape(reply, 429, "throttled")["detail"]
    assert reply.headers["retry-after"] == str(small_app.state.settings.retry_after_s)


def test_ingest_kind_conflict_is_409(client):
    assert client.post("/api/v1/ingest", json=batch([step(1)]), headers=INGEST).status_code == 200
    reply = client.post("/api/v1/ingest", json=batch([step(2)], kind="serving"), headers=INGEST)
    assert "is a training job" in shape(reply, 409, "conflict")["detail"]


def test_duplicate_receiver_name_is_409(client):
    hook = {"name": "oncall", "url": "http://127.0.0.1:9/hook"}
    assert client.post("/api/v1/webhooks", json=hook, headers=ADMIN).status_code == 201
    reply = client.post("/api/v1/webhooks", json=hook, headers=ADMIN)
    detail = shape(reply, 409, "conflict")["detail"]
    assert detail == "a webhook receiver named 'oncall' already exists"


def test_unhandled_exception_is_500_without_internals(app, monkeypatch, caplog):
    def boom(**_: object) -> None:
        raise RuntimeError("password=hunter2 in a stack frame")

    monkeypatch.setattr("backend.jobs.service.list_jobs", boom)
    with (
        caplog.at_level(logging.ERROR, logger="backend.errors"),
        TestClient(app, raise_server_exceptions=False) as client,
    ):
        reply = client.get("/api/v1/jobs", headers=ADMIN)
    assert shape(reply, 500, "internal")["detail"] == INTERNAL_DETAIL
    assert "hunter2" not in reply.text and "Traceback" not in reply.text
    logged = [r for r in caplog.records if r.name == "backend.errors"]
    assert logged and logged[0].exc_info is not None  # the traceback is in the log
    assert "GET /api/v1/jobs" in logged[0].getMessage()


# --- the dashboard keeps its own errors ---------------------------------------------------


def test_dashboard_pages_keep_their_html_errors(client):
    reply = client.get("/jobs/nope")  # development: the dev admin
    assert reply.status_code == 404
    assert reply.headers["content-type"].startswith("text/html")


def test_paths_outside_the_api_keep_fastapis_body(client):
    reply = client.get("/no-such-page")
    assert reply.status_code == 404 and reply.json() == {"detail": "Not Found"}


# --- the handlers on their own ------------------------------------------------------------


@pytest.fixture
def bare() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/api/v1/approve")
    def approve() -> None:
        raise Conflict("guards refused", extra={"guards": [{"name": "cooldown"}], "status": 1})

    @app.get("/api/v1/thing")
    def thing() -> None:
        raise NotFound("thing 7 not found")

    @app.get("/api/v1/refuse")
    def refuse() -> Response:  # returned: a refusal whose audit entry must commit
        return error_response(Conflict("guards refused", extra={"guards": []}))

    @app.get("/page")
    def page() -> None:
        raise RuntimeError("bug")

    return TestClient(app, raise_server_exceptions=False)


def test_extra_keys_join_the_body_without_replacing_its_own(bare):
    reply = bare.get("/api/v1/approve")
    assert reply.status_code == 409
    assert reply.json() == {
        "error": "conflict",
        "status": 409,
        "detail": "guards refused",
        "guards": [{"name": "cooldown"}],
    }


def test_returned_error_response_has_the_same_shape(bare):
    reply = bare.get("/api/v1/refuse")
    assert reply.status_code == 409
    assert reply.json() == {
        "error": "conflict",
        "status": 409,
        "detail": "guards refused",
        "guards": [],
    }


def test_domain_error_needs_no_route_support(bare):
    reply = bare.get("/api/v1/thing")
    assert reply.json() == {"error": "not_found", "status": 404, "detail": "thing 7 not found"}


def test_unhandled_exception_outside_the_api_stays_plain_text(bare):
    reply = bare.get("/page")
    assert reply.status_code == 500 and reply.text == "Internal Server Error"


@pytest.mark.parametrize(
    ("status", "code"),
    [(400, "bad_request"), (413, "too_large"), (429, "throttled"), (406, "not_acceptable")],
)
def test_code_for_status(status, code):
    assert code_for(status) == code


@pytest.mark.parametrize(
    ("loc", "field"),
    [
        (("body", "events", 3, "duration_s"), "events[3].duration_s"),
        (("body",), "body"),
        (("query", "limit"), "query.limit"),
        (("path", "receiver_id"), "path.receiver_id"),
        ((), "body"),
    ],
)
def test_field_path(loc, field):
    assert field_path(loc) == field


def test_error_body_is_json_ready():
    from datetime import UTC, datetime

    body = error_body(409, "conflict", "busy", {"since": datetime(2024, 1, 1, tzinfo=UTC)})
    assert body == {
        "error": "conflict",
        "status": 409,
        "detail": "busy",
        "since": "2024-01-01T00:00:00+00:00",
    }


# --- no echo of the input -----------------------------------------------------------------


def test_a_422_carries_only_an_excerpt_of_a_huge_input(client):
    huge = "k" * 200_000
    reply = client.post(
        "/api/v1/webhooks",
        json={"name": "x", "url": "http://127.0.0.1:9/", "kinds": [huge]},
        headers=ADMIN,
    )
    detail = shape(reply, 422, "invalid")["detail"]
    assert detail[0]["field"] == "kinds"
    assert "unknown incident kinds ['kkkk" in detail[0]["msg"]
    assert len(reply.content) < 2_000  # an excerpt, not the 200 kB


def test_a_dashboard_422_echoes_only_an_excerpt(client):
    reply = client.get(f"/ui/jobs/x/stream?after_step={'9x' * 20_000}")
    assert reply.status_code == 422
    assert reply.json()["detail"][0]["loc"] == ["query", "after_step"]
    assert len(reply.content) < 2_000


def test_a_domain_error_string_is_cut_to_an_excerpt(client):
    reply = client.put(f"/api/v1/policies/{'y' * 5000}", json={"mode": "off"}, headers=ADMIN)
    detail = shape(reply, 422, "invalid")["detail"]
    assert detail.startswith("kind: unknown incident kind 'yyy") and len(detail) < 1_000
    assert detail.endswith("or '*'")  # the useful tail survives the cut


# --- methods: OPTIONS and 405 name every method of the path ----------------------------


def test_options_answers_with_every_method_of_the_path(client):
    reply = client.options("/api/v1/webhooks/7")
    assert reply.status_code == 204
    assert set(reply.headers["allow"].split(", ")) == {"GET", "PATCH", "DELETE", "OPTIONS"}


def test_405_allow_names_every_method_of_the_path(client):
    reply = client.put("/api/v1/webhooks", headers=ADMIN, json={})
    shape(reply, 405, "method_not_allowed")
    assert set(reply.headers["allow"].split(", ")) == {"GET", "POST", "OPTIONS"}


def test_options_on_an_unknown_path_is_404(client):
    assert client.options("/api/v1/nothing-here").status_code == 404

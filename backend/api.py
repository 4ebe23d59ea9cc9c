"""The FastAPI application: every router is mounted here.

>>> from backend.api import create_app
>>> app = create_app()            # settings from VIGIL_* environment
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.openapi.utils import get_openapi
from fastapi.staticfiles import StaticFiles
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from backend import __version__
from backend.actions.views import router as actions_router
from backend.alerts.sealing import configure as configure_sealing
from backend.alerts.views import router as alerts_router
from backend.audit.views import router as audit_router
from backend.auth.service import TokenVerifier
from backend.auth.views import router as tokens_router
from backend.celery_app import configure
from backend.db import make_engine, make_sessionmaker
from backend.detection.schedule import EmbeddedScheduler, make_scheduler
from backend.errors import ERROR_DESCRIPTIONS, ErrorOut, install_error_handlers
from backend.goodput.views import router as goodput_router
from backend.importers.views import router as imports_router
from backend.incidents.views import router as incidents_router
from backend.ingest.multi import router as ingest_multi_router
from backend.ingest.schemas import IngestBatch
from backend.ingest.views import IngestGate
from backend.ingest.views import router as ingest_router
from backend.jobs.views import router as jobs_router
from backend.limits import RequestGuard
from backend.ops import NoStore
from backend.ops import router as ops_router
from backend.readiness import install as install_readiness
from backend.recovery.views import router as recovery_router
from backend.settings import Settings, get_settings
from backend.slos.views import router as slos_router
from backend.swap.views import router as swap_router
from backend.telemetry.serving_views import router as serving_router
from backend.telemetry.views import router as telemetry_router
from backend.ticker import Ticker
from backend.ui.stream import StreamSlots
from backend.ui.views import router as ui_router
from frontend import STATIC_DIR

log = logging.getLogger(__name__)
REF = "#/components/schemas/{model}"


def document_errors(schema: dict[str, Any]) -> None:
    """Every API operation answers with the one error body (``backend.errors``): say so,
    with the statuses any of them can send (token, body limits, request validation)."""
    error = {"application/json": {"schema": {"$ref": REF.format(model="ErrorOut")}}}
    for path, operations in schema["paths"].items():
        if not path.startswith("/api/"):
            continue
        for operation in operations.values():
            common = [401, 403, 422] + ([400, 413] if "requestBody" in operation else [])
            responses = operation.setdefault("responses", {})
            for status in common:
                responses.setdefault(str(status), {"description": ERROR_DESCRIPTIONS[status]})
            for status, response in responses.items():
                if status.startswith(("4", "5")):
                    if status == "422":  # FastAPI's own 422 shape is not what is sent
                        response["description"] = ERROR_DESCRIPTIONS[422]
                        response.pop("content", None)
                    response.setdefault("content", error)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    if "ErrorOut" not in components:
        body = ErrorOut.model_json_schema(ref_template=REF)
        components.update(body.pop("$defs", {}))
        components["ErrorOut"] = body


def create_app(
    settings: Settings | None = None,
    *,
    engine: Engine | None = None,
    session_factory: sessionmaker[Session] | None = None,
) -> FastAPI:
    """Build the app. Tests pass their own engine or session factory; servers pass nothing."""
    settings = settings or get_settings()
    configure_sealing(settings)  # the key webhook secrets are sealed with
    engine = engine or make_engine(settings.database_url, pool_size=settings.db_pool_size)
    factory = session_factory or make_sessionmaker(engine)

    rt = configure(settings, factory)
    # What ingest tells when a job has new data (None: detection is off); embedded mode
    # also runs the periodic work in-process, on a ticker that drains the scheduler.
    scheduler = make_scheduler(settings)
    ticker = Ticker(rt, scheduler) if isinstance(scheduler, EmbeddedScheduler) else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Everything imported and built so far lives as long as the process: move it out
        # of the collector's way, so full collections (every few requests that allocate
        # much) stop walking it — they cost ~100 ms each on a 2-core box before this.
        gc.collect()
        gc.freeze()
        if ticker is not None:
            ticker.start()
        yield
        if ticker is not None:
            ticker.stop()
        app.state.verifier.close()  # writes the tokens' pending last-use times

    app = FastAPI(
        lifespan=lifespan,
        # Served by backend.ops, behind a token in production.
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        title="Vigil",
        version=__version__,
        summary="Observability and fault diagnosis for PyTorch training and LLM serving.",
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessionmaker = factory
    app.state.verifier = TokenVerifier(factory, settings.bootstrap_tokens(), settings.token_cache_s)
    app.state.ingest_gate = IngestGate(settings.max_inflight_ingest)
    app.state.liveness_gate = IngestGate(settings.max_inflight_liveness)
    install_error_handlers(app)
    app.add_middleware(RequestGuard, settings=settings)
    app.state.stream_slots = StreamSlots(settings.max_streams, settings.max_streams_per_token)
    app.state.detection_scheduler = scheduler
    app.state.ticker = ticker

    app.include_router(ingest_router)
    app.include_router(ingest_multi_router)
    app.include_router(jobs_router)
    app.include_router(imports_router)
    app.include_router(actions_router)
    app.include_router(incidents_router)
    app.include_router(alerts_router)
    app.include_router(goodput_router)
    app.include_router(recovery_router)
    app.include_router(slos_router)
    app.include_router(swap_router)
    app.include_router(audit_router)
    app.include_router(tokens_router)
    app.include_router(telemetry_router)
    app.include_router(serving_router)
    app.include_router(ui_router)
    app.include_router(ops_router)
    app.add_middleware(NoStore)
    app.mount("/static", StaticFiles(directory=str(STATIC_DIR)), name="static")
    install_readiness(app)  # GET /readyz, and the pipeline gauges in /metrics

    @app.get("/healthz", tags=["ops"])
    def healthz(request: Request, response: Response) -> dict[str, Any]:
        """Liveness and database reachability; 503 when the database does not answer."""
        try:
            with request.app.state.sessionmaker() as session:
                session.execute(text("SELECT 1"))
            database = "ok"
        except Exception as exc:  # report, don't raise: this is the health check
            database = f"error: {type(exc).__name__}"
            response.status_code = 503
        return {
            "status": "ok" if database == "ok" else "degraded",
            "database": database,
            "mode": "embedded" if settings.embedded else "distributed",
            "version": __version__,
        }

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, routes=app.routes, summary=app.summary
            )
            # The ingest body is parsed by hand (gzip, size limits), so document it here.
            body = IngestBatch.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(body.pop("$defs", {}))
            components["IngestBatch"] = body
            post = schema["paths"]["/api/v1/ingest"]["post"]
            post["requestBody"] = {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/IngestBatch"}}
                },
            }
            document_errors(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app

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
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from backend import __version__
from backend.actions.views import router as actions_router
from backend.alerts.views import router as alerts_router
from backend.audit.views import router as audit_router
from backend.auth.service import TokenVerifier
from backend.auth.views import router as tokens_router
from backend.celery_app import configure
from backend.db import make_engine, make_sessionmaker
from backend.detection.schedule import EmbeddedScheduler, make_scheduler
from backend.errors import install_error_handlers
from backend.goodput.views import router as goodput_router
from backend.incidents.views import router as incidents_router
from backend.ingest.schemas import IngestBatch
from backend.ingest.views import IngestGate
from backend.ingest.views import router as ingest_router
from backend.jobs.views import router as jobs_router
from backend.recovery.views import router as recovery_router
from backend.settings import Settings, get_settings
from backend.slos.views import router as slos_router
from backend.telemetry.prometheus import exposition
from backend.telemetry.serving_views import router as serving_router
from backend.telemetry.views import router as telemetry_router
from backend.ticker import Ticker
from backend.ui.views import router as ui_router
from frontend import STATIC_DIR

log = logging.getLogger(__name__)


def create_app(
    settings: Settings | None = None,
    *,
    engine: Engine | None = None,
    session_factory: sessionmaker[Session] | None = None,
) -> FastAPI:
    """Build the app. Tests pass their own engine or session factory; servers pass nothing."""
    settings = settings or get_settings()
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

    app = FastAPI(
        lifespan=lifespan,
        title="Vigil",
        version=__version__,
        summary="Observability and fault diagnosis for PyTorch training and LLM serving.",
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessionmaker = factory
    app.state.verifier = TokenVerifier(factory, settings.bootstrap_tokens(), settings.token_cache_s)
    app.state.ingest_gate = IngestGate(settings.max_inflight_ingest)
    install_error_handlers(app)
    app.state.detection_scheduler = scheduler
    app.state.ticker = ticker

    app.include_router(ingest_router)
    app.include_router(jobs_router)
    app.include_router(actions_router)
    app.include_router(incidents_router)
    app.include_router(alerts_router)
    app.include_router(goodput_router)
    app.include_router(recovery_router)
    app.include_router(slos_router)
    app.include_router(audit_router)
    app.include_router(tokens_router)
    app.include_router(telemetry_router)
    app.include_router(serving_router)
    app.include_router(ui_router)
    app.mount("/static", StaticFiles(directory=str(STATIC_DIR)), name="static")

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

    @app.get("/metrics", tags=["ops"], include_in_schema=False)
    def metrics() -> Response:
        body = exposition(app.state.sessionmaker)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

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
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app

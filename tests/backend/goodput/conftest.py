"""Mount the goodput router on the test app until backend/api.py mounts it itself."""

from __future__ import annotations

import pytest
from fastapi import FastAPI

from backend.goodput.views import router


@pytest.fixture
def app(app: FastAPI) -> FastAPI:
    if not any(getattr(r, "path", "").endswith("/goodput") for r in app.routes):
        app.include_router(router)
    return app

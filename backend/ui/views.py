"""The web dashboard, mounted as one ``router`` in ``backend/api.py``.

- pages (``backend.ui.pages``, the serving page ``backend.ui.serving``) and form posts
  (``backend.ui.forms``; alert handling: ``backend.ui.handling_forms``): server-rendered
  with Jinja2, autoescaping on for every template; user text is never marked safe;
- live updates (``backend.ui.stream``, SSE); the charts' JSON is the telemetry domain's
  (``backend.telemetry.views``);
- ``/static/plotly.min.js``: plotly.js from the installed ``plotly`` package, so the
  dashboard needs nothing from the network.

Sign-in and CSRF: ``backend.ui.auth``.
"""

from __future__ import annotations

import gzip
import hashlib
from functools import lru_cache
from importlib import resources

from fastapi import APIRouter, Request, Response

from backend.ui import forms, handling_forms, pages, serving, stream

router = APIRouter()
router.include_router(pages.router)
router.include_router(serving.router)
router.include_router(forms.router)
router.include_router(handling_forms.router)
router.include_router(stream.router)


@lru_cache(maxsize=1)
def plotly_js() -> tuple[bytes, bytes, str]:
    """plotly.min.js as shipped in the plotly package: (raw, gzipped, etag)."""
    raw = resources.files("plotly").joinpath("package_data/plotly.min.js").read_bytes()
    etag = '"' + hashlib.sha256(raw).hexdigest()[:32] + '"'
    return raw, gzip.compress(raw, compresslevel=6, mtime=0), etag


@router.get("/static/plotly.min.js", include_in_schema=False)
def plotly_bundle(request: Request) -> Response:
    """Served from the installed package (gzip when the browser takes it), cached a day."""
    raw, packed, etag = plotly_js()
    headers = {"ETag": etag, "Cache-Control": "public, max-age=86400", "Vary": "Accept-Encoding"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    media = "text/javascript; charset=utf-8"
    if "gzip" in request.headers.get("accept-encoding", ""):
        return Response(packed, media_type=media, headers={**headers, "Content-Encoding": "gzip"})
    return Response(raw, media_type=media, headers=headers)

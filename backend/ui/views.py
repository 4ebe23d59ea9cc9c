"""Server-rendered pages. Jinja2 autoescaping is on for every template: job names and
other user-supplied text are escaped, never trusted as HTML."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from backend.deps import SessionDep
from backend.jobs import service as jobs
from frontend import TEMPLATES_DIR

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=str(TEMPLATES_DIR))


@router.get("/", response_class=HTMLResponse)
def jobs_page(request: Request, session: SessionDep) -> HTMLResponse:
    """The job list. Open only in development: the signed-in dashboard comes with the UI
    work; until then, production deployments read through the API with a token."""
    if request.app.state.settings.env != "development":
        context = {"jobs": [], "locked": True}
    else:
        context = {"jobs": jobs.list_jobs(session=session), "locked": False}
    return templates.TemplateResponse(request, "jobs.html", context)

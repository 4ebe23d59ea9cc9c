"""What ``vigil import flight-recorder`` does, over REST or (``--local``) on the database.

    vigil import flight-recorder DUMPS/ --job moe --endpoint http://vigil:8000 --token T
    vigil import flight-recorder DUMPS/ --job moe --local     # writes VIGIL_DATABASE_URL

The dumps are decoded and checked here (``upload_body``), so a bad file is named before
anything is sent; the server answers with the diagnosis, printed as a table. Every
failure is one line on stderr and an exit status: 2 for bad dumps, 1 for a server that
cannot be reached or refuses.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import httpx
from rich.console import Console
from rich.markup import escape

from backend.importers.flight_recorder import import_dumps, load_dumps, upload_body
from backend.settings import Settings
from detectors.flight_recorder import FlightRecorderError

TIMEOUT_S = 120.0


def _stored(console: Console, incident_id: int | None, job: str, where: str) -> None:
    if incident_id is not None:
        console.print(
            f"\nstored as hang incident {incident_id} of job {job!r} {where}",
            markup=False,
            highlight=False,
        )
    else:
        console.print("\nno rank waits for another: nothing stored")


def _refusal(reply: httpx.Response) -> str:
    try:
        detail = reply.json().get("detail")
    except (ValueError, AttributeError):
        detail = reply.text[:300]
    if isinstance(detail, list):  # invalid fields: name them
        detail = "; ".join(f"{d.get('field')}: {d.get('msg')}" for d in detail[:3])
    return " ".join(str(detail).split())


def unreachable(endpoint: str, exc: Exception) -> str:
    """The line (rich markup) for a server that cannot be reached."""
    return (
        f"[red]cannot reach {endpoint} ({escape(str(exc))}): start `vigil server` or pass "
        "--endpoint URL [VIGIL_ENDPOINT]; --local writes VIGIL_DATABASE_URL instead[/red]"
    )


def refused(endpoint: str, reply: httpx.Response, more: str = "") -> str:
    """The line (rich markup) for a server that refused an import, with what to do."""
    hint = ""
    if reply.status_code == 413:
        hint = " (the server's VIGIL_MAX_BODY_BYTES limits an import)"
    elif reply.status_code in (401, 403):
        hint = " (pass --token [VIGIL_TOKEN] with the 'ingest' scope)"
    return (
        f"[red]{endpoint} refused the import: {reply.status_code} "
        f"{escape(_refusal(reply))}{hint}{escape(more)}[/red]"
    )


def over_rest(
    *, directory: Path, job: str, endpoint: str, token: str, console: Console, err: Console
) -> int:
    """Send the dumps to ``endpoint``; print the diagnosis it answers. The exit status."""
    try:
        body = json.dumps(upload_body(directory), default=str, separators=(",", ":"))
    except FlightRecorderError as exc:
        err.print(f"[red]{escape(str(exc))}[/red]", soft_wrap=True)
        return 2
    url = f"{endpoint}/api/v1/jobs/{quote(job, safe='')}/imports/flight-recorder"
    try:
        reply = httpx.post(
            url,
            content=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            timeout=TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        err.print(unreachable(endpoint, exc), soft_wrap=True)
        return 1
    if reply.status_code != 200:
        err.print(refused(endpoint, reply), soft_wrap=True)
        return 1
    out = reply.json()
    console.print(out["report"], highlight=False, markup=False)
    _stored(console, out["incident_id"], job, f"on {endpoint}")
    return 0


def locally(
    *, directory: Path, job: str, settings: Settings, console: Console, err: Console
) -> int:
    """Diagnose and store in ``settings.database_url`` (its schema already checked)."""
    from backend.db import make_engine, make_sessionmaker, session_scope

    engine = make_engine(settings.database_url)
    try:
        dumps = load_dumps(directory)
        with session_scope(make_sessionmaker(engine), write=True) as session:
            result = import_dumps(session=session, dumps=dumps, job=job)
    except FlightRecorderError as exc:
        err.print(f"[red]{escape(str(exc))}[/red]", soft_wrap=True)
        return 2
    finally:
        engine.dispose()
    console.print(result.report, highlight=False, markup=False)
    _stored(console, result.incident_id, job, "in the local database")
    return 0

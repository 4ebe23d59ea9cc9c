"""What ``vigil import kineto`` does, over REST or (``--local``) on the database.

    vigil import kineto rank-0.json.gz --job llama --endpoint http://vigil:8000 --token T
    vigil import kineto traces/ --job llama            # one file per rank: a multi-rank job
    vigil import kineto trace.json --job llama --rank 3 --local

The traces are read and checked here (``kineto_upload``) before anything is sent, and the
per-iteration breakdown is printed; the server stores it (``kineto_store``). Every failure
is one line on stderr and an exit status: 2 for a bad trace, 1 for a server that cannot be
reached or refuses.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from rich.console import Console
from rich.markup import escape

from backend.importers.command import TIMEOUT_S, refused, unreachable
from backend.importers.kineto_schemas import KinetoImport
from backend.importers.kineto_store import import_kineto
from backend.importers.kineto_stream import KinetoError
from backend.importers.kineto_upload import checked_bodies, load_traces, render
from backend.settings import Settings


def _read(
    paths: Sequence[Path], rank: int | None, console: Console, err: Console
) -> list[dict[str, Any]] | None:
    """The request bodies of the traces, checked; ``None`` after naming a bad one."""
    try:
        traces = load_traces(paths, rank=rank)
        bodies = checked_bodies(traces)
    except KinetoError as exc:
        err.print(f"[red]{escape(str(exc))}[/red]", soft_wrap=True)
        return None
    console.print(render(traces), highlight=False, markup=False)
    return bodies


def _summary(console: Console, job: str, out: dict[str, Any], where: str) -> None:
    """The closing lines: what was stored, and what the detectors found in it."""
    line = (
        f"\nstored {out['iterations']} iterations of rank(s) {_ranks(out['ranks'])} "
        f"as job {job!r} {where}"
    )
    if out["duplicates"]:
        line += f" ({_ranks(out['duplicates'])} stored before: kept once)"
    console.print(line, markup=False, highlight=False)
    for incident in out["incidents"]:
        console.print(
            f"incident {incident['id']} ({incident['kind']}, ranks "
            f"{_ranks(incident['ranks'])}): {incident['summary']}",
            markup=False,
            highlight=False,
        )


def _total() -> dict[str, Any]:
    """What a run of requests stored, added up by ``_add``."""
    return {"ranks": [], "duplicates": [], "iterations": 0, "incidents": []}


def _add(total: dict[str, Any], out: dict[str, Any]) -> None:
    total["ranks"] = sorted(set(total["ranks"]) | set(out["ranks"]))
    total["duplicates"] = sorted(set(total["duplicates"]) | set(out["duplicates"]))
    total["iterations"] += out["iterations"]
    found = {i["id"]: i for i in [*total["incidents"], *out["incidents"]]}
    total["incidents"] = list(found.values())


def _ranks(ranks: list[int]) -> str:
    listed = sorted(ranks)
    shown = ", ".join(map(str, listed[:16]))
    return shown + (f" … ({len(listed)} ranks)" if len(listed) > 16 else "")


def over_rest(
    *,
    paths: Sequence[Path],
    job: str,
    rank: int | None,
    endpoint: str,
    token: str,
    console: Console,
    err: Console,
) -> int:
    """Read the traces, send them to ``endpoint`` in as few bodies as fit. The exit status."""
    bodies = _read(paths, rank, console, err)
    if bodies is None:
        return 2
    url = f"{endpoint}/api/v1/jobs/{quote(job, safe='')}/imports/kineto"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    total = _total()
    for body in bodies:
        try:
            reply = httpx.post(
                url,
                content=json.dumps(body, separators=(",", ":")),
                headers=headers,
                timeout=TIMEOUT_S,
            )
        except httpx.HTTPError as exc:
            err.print(unreachable(endpoint, exc), soft_wrap=True)
            return 1
        if reply.status_code != 200:
            stored = total["iterations"]
            more = f"; {stored} iterations were stored: run it again" if stored else ""
            err.print(refused(endpoint, reply, more), soft_wrap=True)
            return 1
        _add(total, reply.json())
    _summary(console, job, total, f"on {endpoint}")
    return 0


def locally(
    *,
    paths: Sequence[Path],
    job: str,
    rank: int | None,
    settings: Settings,
    console: Console,
    err: Console,
) -> int:
    """Store in ``settings.database_url`` (its schema already checked), in one transaction."""
    from backend.db import make_engine, make_sessionmaker, session_scope
    from backend.errors import DomainError

    bodies = _read(paths, rank, console, err)
    if bodies is None:
        return 2
    engine = make_engine(settings.database_url)
    total = _total()
    try:
        with session_scope(make_sessionmaker(engine), write=True) as session:
            for body in bodies:
                out = import_kineto(
                    session=session,
                    body=KinetoImport.model_validate(body),
                    job=job,
                    settings=settings,
                )
                incidents = [
                    {"id": i.id, "kind": i.kind, "ranks": list(i.ranks), "summary": i.summary}
                    for i in out.incidents
                ]
                _add(total, {**asdict(out), "incidents": incidents})
    except DomainError as exc:
        err.print(f"[red]{escape(str(exc.detail))}[/red]", soft_wrap=True)
        return 1
    finally:
        engine.dispose()
    _summary(console, job, total, "in the local database")
    return 0

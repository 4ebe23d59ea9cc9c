"""Request-scoped dependencies shared by the routers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from sqlalchemy.orm import Session

from backend.db import session_scope

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def get_session(request: Request) -> Iterator[Session]:
    """A session per request; commits if the handler returns, rolls back if it raises.

    Requests that change things start a write transaction at once (on SQLite a deferred
    transaction that reads, then writes, fails immediately when another writer is active).
    """
    write = request.method not in READ_METHODS
    with session_scope(request.app.state.sessionmaker, write=write) as session:
        yield session


# scope="function": commit before the response is sent, so a 2xx means it is stored.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]

# Row ids are INTEGER columns: a larger number is no id (422), not a database error (500).
MAX_ROW_ID = 2**31 - 1
RowId = Annotated[int, Path(ge=0, le=MAX_ROW_ID)]
RowIdQuery = Annotated[int | None, Query(ge=0, le=MAX_ROW_ID)]
# Steps and ranks as query filters: no larger than ingest stores (``backend.ingest.schemas``).
StepQuery = Annotated[int | None, Query(ge=0, le=2**53 - 1)]
RankQuery = Annotated[int | None, Query(ge=0, le=MAX_ROW_ID)]
# One run of a job (``backend.jobs.runs``) by its number; absent: every run of the job.
RunQuery = Annotated[
    int | None,
    Query(ge=1, le=MAX_ROW_ID, description="Only this run of the job (its number: 1, 2, …)"),
]

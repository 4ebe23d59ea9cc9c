"""Request-scoped dependencies shared by the routers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
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

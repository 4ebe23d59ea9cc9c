"""Request and response shapes of the tokens API. A token's secret is in one response only,
the one that created it; lists show its first characters (``prefix``) to tell tokens apart.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from backend.auth.models import ApiToken

# The scopes of ``backend.auth.models.SCOPES`` (a test keeps the two equal).
Scope = Literal["ingest", "read", "admin"]
TokenName = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=128)]


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: TokenName = Field(description="Who or what uses the token.", examples=["ranks"])
    scopes: list[Scope] = Field(
        min_length=1, description="`admin` implies the others.", examples=[["ingest"]]
    )


class TokenOut(BaseModel):
    id: int
    name: str
    prefix: str = Field(description="The token's first characters, not a secret.")
    scopes: list[str]
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None = Field(description="Null while the token is valid.")

    @classmethod
    def of(cls, row: ApiToken, seen: datetime | None = None) -> TokenOut:
        """``seen``: a use this process knows of and has not written yet (the verifier
        writes last-use times in batches, off the request path)."""
        last = row.last_used_at
        if seen is not None and (last is None or seen > last):
            last = seen
        return cls(
            id=row.id,
            name=row.name,
            prefix=row.prefix,
            scopes=row.scopes.split(),
            created_at=row.created_at,
            last_used_at=last,
            revoked_at=row.revoked_at,
        )


class TokenCreated(TokenOut):
    token: str = Field(description="The token itself: shown in this response only, store it.")

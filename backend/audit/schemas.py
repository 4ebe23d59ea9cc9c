"""Response shape of the audit API."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel


class AuditOut(BaseModel):
    id: int
    job: str | None
    action_id: int | None
    incident_id: int | None
    at: datetime
    actor: str
    event: str
    detail: dict[str, Any]

"""Bodies of ``POST /api/v1/jobs/{job}/imports/flight-recorder``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MAX_RANK = 2**31 - 1


class DumpIn(BaseModel):
    """One rank's Flight Recorder dump, decoded by the client (``vigil import``)."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(ge=0, le=MAX_RANK, description="The rank that wrote the dump.")
    source: str = Field(
        "", max_length=256, description="Where it came from (a file name), for messages."
    )
    dump: dict[str, Any] = Field(
        description="The dump's values as JSON: `entries` (required), `pg_config`, "
        "`pg_status`, `version`, as PyTorch writes them (tuples as lists); fields the "
        "diagnosis does not read (stack frames, ...) may be left out.",
    )


class FlightRecorderImport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dumps: list[DumpIn] = Field(
        min_length=1, max_length=65_536, description="One dump per rank, each rank once."
    )


class FlightRecorderImportOut(BaseModel):
    job: str
    ranks: int = Field(description="Ranks whose dumps were read.")
    culprits: list[int] = Field(description="The ranks the others wait for.")
    incident_id: int | None = Field(
        description="The job's `hang` incident naming them; null when no rank waits."
    )
    report: str = Field(description="The diagnosis as a table, as `vigil import` prints it.")

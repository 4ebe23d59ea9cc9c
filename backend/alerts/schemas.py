"""Request and response shapes of the webhooks API.

Secrets never leave the server after creation: responses carry ``has_secret`` and the names
(not values) of extra headers, and URLs with their credentials masked (a Slack webhook URL
is itself a credential). ``POST /webhooks`` returns a secret it generated, once.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from backend.alerts import formats
from backend.alerts.models import (
    DEFAULT_GROUP_WAIT_S,
    GROUP_LABELS,
    RECEIVER_FORMATS,
    Silence,
    WebhookReceiver,
)
from backend.deps import MAX_ROW_ID
from backend.incidents.models import INCIDENT_KINDS, SEVERITIES

MASK = "***"
MAX_REPEAT_S = 30 * 86_400
MAX_GROUP_WAIT_S = 3600
Name = Annotated[str, Field(min_length=1, max_length=200, examples=["oncall-alertmanager"])]
Url = Annotated[str, Field(min_length=1, max_length=2000, examples=["https://hooks.example.com/x"])]


def _url(value: str) -> str:
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    return value.strip()


def _format(value: str) -> str:
    if value not in RECEIVER_FORMATS:
        raise ValueError(f"must be one of {', '.join(RECEIVER_FORMATS)}")
    return value


def _subset(value: list[str] | None, allowed: tuple[str, ...], what: str) -> list[str] | None:
    if value is None:
        return None
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; known: {', '.join(allowed)}")
    return sorted(set(value))


def _secret(value: str | None) -> str | None:
    if value is not None:
        formats.secret_key(value)  # raises ValueError with the reason
    return value


def _headers(value: dict[str, str]) -> dict[str, str]:
    for key, item in value.items():
        if not key or any(c in key for c in " :\r\n\t") or "\r" in item or "\n" in item:
            raise ValueError(f"invalid header {key!r}")
    return value


class _Checked(BaseModel):
    """Checks shared by create and update (None passes: in an update it means "unchanged"
    or, for the filters, "any")."""

    # strict: `true` is no integer, "5" no number (as the OpenAPI schema says)
    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("url", check_fields=False)
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        return None if value is None else _url(value)

    @field_validator("format", check_fields=False)
    @classmethod
    def _check_format(cls, value: str | None) -> str | None:
        return None if value is None else _format(value)

    @field_validator("secret", check_fields=False)
    @classmethod
    def _check_secret(cls, value: str | None) -> str | None:
        return _secret(value)

    @field_validator("headers", check_fields=False)
    @classmethod
    def _check_headers(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return None if value is None else _headers(value)

    @field_validator("kinds", check_fields=False)
    @classmethod
    def _check_kinds(cls, value: list[str] | None) -> list[str] | None:
        return _subset(value, INCIDENT_KINDS, "incident kinds")

    @field_validator("severities", check_fields=False)
    @classmethod
    def _check_severities(cls, value: list[str] | None) -> list[str] | None:
        return _subset(value, SEVERITIES, "severities")

    @field_validator("group_by", check_fields=False)
    @classmethod
    def _check_group_by(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        unknown = sorted(set(value) - set(GROUP_LABELS))
        if unknown:
            raise ValueError(f"unknown labels {unknown}; known: {', '.join(GROUP_LABELS)}")
        return [k for k in GROUP_LABELS if k in value]  # one order: one group key


class WebhookCreate(_Checked):
    name: Name
    url: Url
    format: str = Field("alertmanager", description="alertmanager | slack | generic")
    secret: str | None = Field(
        None,
        description="Standard Webhooks secret (`whsec_<base64>`) for the generic format; "
        "generated when omitted and returned once, in this response.",
    )
    headers: dict[str, str] = Field(
        default_factory=dict, description="Extra request headers, e.g. Authorization."
    )
    jobs: list[str] | None = Field(None, description="Only these job names; null = any.")
    kinds: list[str] | None = Field(None, description="Only these incident kinds; null = any.")
    severities: list[str] | None = Field(None, description="Only these severities; null = any.")
    send_resolved: bool = True
    repeat_interval_s: int = Field(
        4 * 3600, ge=0, le=MAX_REPEAT_S, description="Remind while open; 0 = never."
    )
    group_by: list[str] | None = Field(
        None,
        description="Labels that group incidents into one notification (alertname, job, "
        "kind, severity, incident_id; `[]`: one group). Null: `[job]`, or `[incident_id]` "
        "(no grouping) for the generic format.",
    )
    group_wait_s: int = Field(
        DEFAULT_GROUP_WAIT_S,
        ge=0,
        le=MAX_GROUP_WAIT_S,
        description="How long a new group waits for more incidents before it is sent.",
    )
    enabled: bool = True


class WebhookUpdate(_Checked):
    """Only the fields sent change. ``jobs``/``kinds``/``severities`` may be set to null
    (any); ``secret`` to a new ``whsec_`` value (rotation)."""

    name: Name | None = None
    url: Url | None = None
    format: str | None = None
    secret: str | None = None
    headers: dict[str, str] | None = None
    jobs: list[str] | None = None
    kinds: list[str] | None = None
    severities: list[str] | None = None
    send_resolved: bool | None = None
    repeat_interval_s: Annotated[int, Field(ge=0, le=MAX_REPEAT_S)] | None = None
    group_by: list[str] | None = None
    group_wait_s: Annotated[int, Field(ge=0, le=MAX_GROUP_WAIT_S)] | None = None
    enabled: bool | None = None

    def changes(self) -> dict[str, Any]:
        """The fields the client sent; null is refused where it has no meaning."""
        sent = {k: getattr(self, k) for k in self.model_fields_set}
        not_null = (
            "name",
            "url",
            "format",
            "headers",
            "send_resolved",
            "repeat_interval_s",
            "group_wait_s",
        )
        for key in not_null:
            if key in sent and sent[key] is None:
                raise ValueError(f"{key}: may not be null")
        return sent


def redact_url(url: str, fmt: str) -> str:
    """The URL with its credentials masked: password, query values, and a Slack webhook's
    path (``https://hooks.slack.com/services/***``)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(f":{parts.password}@", f":{MASK}@", 1)
    query = urlencode(
        [(k, MASK) for k, _ in parse_qsl(parts.query, keep_blank_values=True)], safe="*"
    )
    path = parts.path
    if fmt == "slack":
        first = path.strip("/").split("/", 1)[0]
        path = f"/{first}/{MASK}" if first else f"/{MASK}"
    return urlunsplit((parts.scheme, netloc, path, query, ""))


class WebhookOut(BaseModel):
    id: int
    name: str
    url: str = Field(description="With credentials masked.")
    format: str
    has_secret: bool
    header_names: list[str] = Field(description="Extra headers sent (values not shown).")
    jobs: list[str] | None
    kinds: list[str] | None
    severities: list[str] | None
    send_resolved: bool
    repeat_interval_s: int
    group_by: list[str] = Field(description="In effect (the format's default when unset).")
    group_wait_s: int
    enabled: bool
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, row: WebhookReceiver) -> WebhookOut:
        return cls(
            id=row.id,
            name=row.name,
            url=redact_url(row.url, row.format),
            format=row.format,
            has_secret=bool(row.secret_stored),
            header_names=row.header_names,
            jobs=row.jobs,
            kinds=row.kinds,
            severities=row.severities,
            send_resolved=row.send_resolved,
            repeat_interval_s=row.repeat_interval_s,
            group_by=row.group_by,
            group_wait_s=row.group_wait_s,
            enabled=row.enabled,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )


class WebhookCreated(WebhookOut):
    secret: str | None = Field(
        None, description="The signing secret (generic format). Shown only in this response."
    )


class DeliveryOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    receiver_id: int
    incident_id: int | None = Field(description="The group's first incident.")
    incident_ids: list[int] = Field(
        default_factory=list, description="Every incident in the notification (its group)."
    )
    status: str = Field(description="firing | resolved | test")
    state: str = Field(description="pending | sending | delivered | failed")
    webhook_id: str
    attempts: int
    next_attempt_at: datetime
    last_attempt_at: datetime | None
    response_code: int | None
    error: str | None
    created_at: datetime
    delivered_at: datetime | None
    payload: dict[str, Any]


# --- silences ------------------------------------------------------------------------------


class Matchers(BaseModel):
    """What a silence mutes: all matchers given must match (at least one)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    job: str | None = Field(
        None, min_length=1, max_length=200, description="Job name, or a glob (`llama-*`)."
    )
    kind: str | None = Field(None, description="Incident kind.")
    severity: str | None = Field(None, description="info | warning | critical")
    rank: int | None = Field(None, ge=0, le=MAX_ROW_ID, description="The incident names it.")

    @field_validator("kind")
    @classmethod
    def _check_kind(cls, value: str | None) -> str | None:
        if value is not None and value not in INCIDENT_KINDS:
            raise ValueError(f"unknown kind {value!r}; known: {', '.join(INCIDENT_KINDS)}")
        return value

    @field_validator("severity")
    @classmethod
    def _check_severity(cls, value: str | None) -> str | None:
        if value is not None and value not in SEVERITIES:
            raise ValueError(f"unknown severity {value!r}; known: {', '.join(SEVERITIES)}")
        return value

    def given(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class SilenceCreate(BaseModel):
    """A silence ends at ``ends_at`` or after ``duration_s`` (give one of them)."""

    model_config = ConfigDict(extra="forbid")

    matchers: Matchers
    starts_at: datetime | None = Field(None, description="Default: now.")
    ends_at: datetime | None = Field(None, description="With a time zone.")
    duration_s: int | None = Field(
        None, ge=60, le=365 * 86_400, strict=True, description="From `starts_at` (or now)."
    )
    comment: str = Field("", max_length=2000, description="Why (shown on the incidents).")


class SilenceOut(BaseModel):
    id: int
    matchers: dict[str, Any]
    state: str = Field(description="pending | active | expired")
    starts_at: datetime
    ends_at: datetime
    created_by: str
    comment: str
    created_at: datetime
    expired_by: str | None

    @classmethod
    def of(cls, row: Silence, now: datetime) -> SilenceOut:
        return cls(
            id=row.id,
            matchers=row.matchers,
            state=row.state(now),
            starts_at=row.starts_at,
            ends_at=row.ends_at,
            created_by=row.created_by,
            comment=row.comment,
            created_at=row.created_at,
            expired_by=row.expired_by,
        )

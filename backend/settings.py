"""Settings for every Vigil server process, read from ``VIGIL_*`` environment variables.

    >>> from backend.settings import Settings
    >>> Settings(database_url="sqlite:///./vigil.db").embedded
    True

Values are checked when the process starts, not when they are first used: a bad
``VIGIL_DATABASE_URL`` stops ``vigil server`` with a message naming the variable.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

log = logging.getLogger(__name__)

# Well-known tokens used when nothing is configured in development. They are printed
# in the README, so they are refused anywhere else.
DEV_ADMIN_TOKEN = "vigil-dev-admin"
DEV_INGEST_TOKEN = "vigil-dev-ingest"
_PLACEHOLDERS = {
    "",
    "changeme",
    "change-me",
    "secret",
    "password",
    "token",
    "admin",
    "test",
    "xxx",
    DEV_ADMIN_TOKEN,
    DEV_INGEST_TOKEN,
}
MIN_SECRET_LENGTH = 16


class SettingsError(RuntimeError):
    """Raised with a readable, multi-line message when the environment is invalid."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VIGIL_", extra="ignore", frozen=True)

    env: Literal["development", "production"] = Field(
        "development",
        description="`production` refuses placeholder secrets and requires an admin token.",
    )
    database_url: str = Field(
        "sqlite:///./vigil.db",
        description="SQLAlchemy URL: `sqlite:///path` (embedded) or `postgresql+psycopg://…`.",
    )
    redis_url: str | None = Field(
        None, description="Redis URL for Celery and locks; unset means embedded mode."
    )
    liveness_store: Literal["redis", "sql"] = Field(
        "redis",
        description="Distributed mode: where heartbeats and in-flight ops land. `redis` "
        "keeps them off SQL (rank rows refreshed every 10 s, "
        "`backend.telemetry.liveness`); `sql` writes each to its rank row, as embedded mode.",
    )
    admin_token: SecretStr | None = Field(
        None, description="Bootstrap token with every scope. Required in production."
    )
    ingest_token: SecretStr | None = Field(
        None, description="Bootstrap token with the `ingest` scope, for collectors."
    )
    secret_key: SecretStr | None = Field(
        None,
        description="Encrypts webhook secrets at rest (any long random string). Unset: a key "
        "kept in `<sqlite database>.key` (mode 0600), else derived from the admin token.",
    )
    secret_key_previous: SecretStr | None = Field(
        None,
        description="Keys used before a rotation, comma-separated: what they sealed still "
        "opens, and is sealed with VIGIL_SECRET_KEY on its next change.",
    )
    metrics_public: bool | None = Field(
        None, description="`/metrics` without a token; unset: public in development only."
    )
    docs_public: bool | None = Field(
        None,
        description="`/docs`, `/redoc`, `/openapi.json` without a token; unset: public in "
        "development only.",
    )
    host: str = Field("127.0.0.1", description="Address `vigil server` listens on.")
    port: int = Field(8000, ge=1, le=65535, description="Port `vigil server` listens on.")
    max_body_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, description="Largest ingest body, before and after gzip."
    )
    max_request_bytes: int = Field(
        1024 * 1024,
        ge=1024,
        description="Largest request body on every other route (413 past it, as it streams).",
    )
    max_streams: int = Field(
        100, ge=1, description="Open live streams (SSE) per process before replying 503."
    )
    max_streams_per_token: int = Field(
        8, ge=1, description="Open live streams per token (or browser) before replying 429."
    )
    max_events_per_batch: int = Field(20_000, ge=1, description="Most events in one batch.")
    max_inflight_ingest: int = Field(
        16, ge=1, description="Concurrent ingest requests per process before replying 429."
    )
    max_inflight_liveness: int = Field(
        32,
        ge=1,
        description="Concurrent heartbeat-only ingest requests per process let in past a full "
        "`max_inflight_ingest` (then 429): overload must not silence live ranks.",
    )
    retry_after_s: int = Field(2, ge=1, description="`Retry-After` sent with 429.")
    db_pool_size: int = Field(10, ge=1, description="Database connections per process.")
    token_cache_s: float = Field(
        10.0, ge=0, description="How long a verified API token is trusted without a lookup."
    )
    detect_interval_s: float = Field(
        2.0, ge=0, description="Run detectors for jobs with new data this often; 0 disables."
    )
    sweep_interval_s: float = Field(
        2.0, gt=0, description="Look for hangs and crashes (silent jobs) this often."
    )
    detect_window_steps: int = Field(200, ge=10, description="Steps the detectors look at.")
    ready_max_lag_s: float = Field(
        60.0,
        gt=0,
        description="`/readyz` fails when a detection request waits longer than this.",
    )
    retention_days: float = Field(
        30, ge=0, description="Delete telemetry older than this many days; 0 keeps it forever."
    )
    raw_retention_days: float = Field(
        14,
        ge=0,
        description="PostgreSQL: drop the day partitions of raw steps and collectives older "
        "than this many days (rollups stay with their job); 0 keeps them.",
    )
    public_url: str = Field(
        "http://127.0.0.1:8000",
        description="How people reach this Vigil (links in alerts, e.g. https://vigil.example).",
    )
    webhook_timeout_s: float = Field(5.0, gt=0, le=60, description="Per webhook request.")
    webhook_hosts: str = Field(
        "",
        description="Comma-separated hosts webhooks may be sent to (e.g. "
        "`hooks.slack.com,alertmanager`); a delivery to any other fails unsent. Empty: any.",
    )
    webhook_max_attempts: int = Field(
        8, ge=1, le=50, description="Tries per notification before it is marked failed."
    )
    webhook_backoff_s: float = Field(
        2.0, gt=0, description="First retry delay; doubles per attempt (capped at 10 minutes)."
    )
    restart_cooldown_s: float = Field(
        300, ge=0, description="Default: no automatic action on a job this soon after another."
    )
    max_restarts_per_hour: int = Field(
        3, ge=0, description="Default cap on restarts and evictions per job per hour."
    )
    swap_bandwidth_bytes_per_s: float = Field(
        12e9,
        gt=0,
        allow_inf_nan=False,
        description="Host↔device copy bandwidth the activation-swap policy generator assumes "
        "(bytes/s); 12e9 is PCIe 4.0 x16-class pinned copies.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, value: str) -> str:
        scheme = value.split(":", 1)[0]
        if not (scheme.startswith("sqlite") or scheme.startswith("postgresql")):
            raise ValueError(
                f"unsupported database {scheme!r}: use sqlite:///path or postgresql+psycopg://…"
            )
        if scheme in ("postgresql", "postgres"):
            # psycopg 3 is the driver we ship; plain postgresql:// would ask for psycopg2.
            value = "postgresql+psycopg" + value[len(scheme) :]
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value

    @field_validator("secret_key", "secret_key_previous", mode="before")
    @classmethod
    def _empty_key_is_unset(cls, value: object) -> object:
        # `VIGIL_SECRET_KEY: ${VIGIL_SECRET_KEY:-}` in a compose file means "not set".
        return None if value == "" else value

    @model_validator(mode="after")
    def _secrets(self) -> Settings:
        if self.env != "production":
            return self
        if self.admin_token is None:
            raise ValueError("VIGIL_ADMIN_TOKEN is required when VIGIL_ENV=production")
        for name in ("admin_token", "ingest_token", "secret_key"):
            secret: SecretStr | None = getattr(self, name)
            if secret is None:
                continue
            raw = secret.get_secret_value()
            if raw.lower() in _PLACEHOLDERS or len(raw) < MIN_SECRET_LENGTH:
                raise ValueError(
                    f"VIGIL_{name.upper()} is a placeholder or shorter than "
                    f"{MIN_SECRET_LENGTH} characters; refused when VIGIL_ENV=production"
                )
        return self

    @property
    def embedded(self) -> bool:
        """True when running without Redis: Celery eager, periodic work in-process."""
        return self.redis_url is None

    @property
    def ops_public(self) -> tuple[bool, bool]:
        """Whether ``/metrics`` and the API docs answer without a token: (metrics, docs)."""
        dev = self.env == "development"
        metrics = self.metrics_public if self.metrics_public is not None else dev
        docs = self.docs_public if self.docs_public is not None else dev
        return metrics, docs

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    def allowed_webhook_hosts(self) -> frozenset[str]:
        """``VIGIL_WEBHOOK_HOSTS`` as a set of lower-case host names; empty: any host."""
        return frozenset(h.strip().lower() for h in self.webhook_hosts.split(",") if h.strip())

    def bootstrap_tokens(self) -> dict[str, frozenset[str]]:
        """Tokens from the environment, mapped to their scopes."""
        tokens: dict[str, frozenset[str]] = {}
        admin = self.admin_token.get_secret_value() if self.admin_token else None
        ingest = self.ingest_token.get_secret_value() if self.ingest_token else None
        if self.env == "development":
            admin = admin or DEV_ADMIN_TOKEN
            ingest = ingest or DEV_INGEST_TOKEN
        if ingest:
            tokens[ingest] = frozenset({"ingest"})
        if admin:
            tokens[admin] = frozenset({"admin", "read", "ingest"})
        return tokens


def load_settings(**overrides: object) -> Settings:
    """Build settings from the environment, turning validation errors into one clear message."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"])
            name = f"VIGIL_{field.upper()}" if field else "settings"
            message = err["msg"].removeprefix("Value error, ")
            lines.append(f"  {name}: {message}")
        raise SettingsError("invalid Vigil settings:\n" + "\n".join(lines)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load_settings()

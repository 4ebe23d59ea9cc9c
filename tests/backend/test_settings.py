"""Settings fail fast with a message naming the variable; placeholders are refused in production."""

from __future__ import annotations

import pytest

from backend.settings import DEV_ADMIN_TOKEN, Settings, SettingsError, load_settings

STRONG = "k3Jd93jfQ0x-aa81Lr0qP"


def test_defaults_are_embedded_sqlite():
    s = Settings(_env_file=None)
    assert s.embedded and s.is_sqlite
    assert s.bootstrap_tokens()[DEV_ADMIN_TOKEN] >= {"admin", "read", "ingest"}


def test_environment_is_read_with_the_vigil_prefix(monkeypatch):
    monkeypatch.setenv("VIGIL_DATABASE_URL", "postgresql://u@db/vigil")
    monkeypatch.setenv("VIGIL_REDIS_URL", "redis://cache:6379/0")
    monkeypatch.setenv("VIGIL_PORT", "9000")
    s = load_settings()
    assert s.database_url == "postgresql+psycopg://u@db/vigil"  # psycopg 3, not psycopg2
    assert not s.embedded and s.port == 9000


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("VIGIL_DATABASE_URL", "mysql://x/y", "VIGIL_DATABASE_URL: unsupported database 'mysql'"),
        ("VIGIL_REDIS_URL", "localhost:6379", "VIGIL_REDIS_URL: must start with redis://"),
        ("VIGIL_PORT", "eighty", "VIGIL_PORT"),
        ("VIGIL_MAX_BODY_BYTES", "10", "VIGIL_MAX_BODY_BYTES"),
        ("VIGIL_ENV", "staging", "VIGIL_ENV"),
    ],
)
def test_bad_values_fail_with_the_variable_named(monkeypatch, var, value, message):
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert message in str(info.value)


def test_production_requires_an_admin_token(monkeypatch):
    monkeypatch.setenv("VIGIL_ENV", "production")
    with pytest.raises(SettingsError, match="VIGIL_ADMIN_TOKEN is required"):
        load_settings()


@pytest.mark.parametrize("placeholder", ["changeme", "secret", DEV_ADMIN_TOKEN, "short"])
def test_production_refuses_placeholder_secrets(monkeypatch, placeholder):
    monkeypatch.setenv("VIGIL_ENV", "production")
    monkeypatch.setenv("VIGIL_ADMIN_TOKEN", placeholder)
    with pytest.raises(SettingsError, match="placeholder"):
        load_settings()


def test_production_has_no_development_tokens(monkeypatch):
    monkeypatch.setenv("VIGIL_ENV", "production")
    monkeypatch.setenv("VIGIL_ADMIN_TOKEN", STRONG)
    tokens = load_settings().bootstrap_tokens()
    assert list(tokens) == [STRONG]

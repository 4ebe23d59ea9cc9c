"""Collector tests talk to a real ``vigil server`` process over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import collector


@pytest.fixture(autouse=True)
def _no_client_left_behind() -> Iterator[None]:
    yield
    collector.shutdown(timeout=1)


@pytest.fixture
def sqlite_url(tmp_path):  # type: ignore[no-untyped-def]
    return f"sqlite:///{tmp_path / 'vigil.db'}"

"""Collector tests talk to a real ``vigil server`` process over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import collector


@pytest.fixture(autouse=True)
def _no_client_left_behind() -> Iterator[None]:
    yield
    collector.shutdown(timeout=1)

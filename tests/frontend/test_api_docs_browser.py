"""``/docs`` in a real browser with no internet: Swagger UI comes from the server itself (an
installed package), never from a CDN, and draws the API under the page's
Content-Security-Policy (no inline script). ReDoc is not served: ``/redoc`` leads to ``/docs``.

Chromium comes from the system, as in ``test_browser.py``; without it these are skipped.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.servers import live_server

sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = os.environ.get("VIGIL_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium (or set VIGIL_CHROMIUM)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with live_server(f"sqlite:///{tmp_path_factory.mktemp('docs') / 'vigil.db'}") as base:
        yield base


@pytest.fixture
def page(browser: Any, server: str, tmp_path: Path) -> Iterator[Any]:
    """A page that records every request it makes, every script error and every console
    error (a CSP refusal is one)."""
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    page = context.new_page()
    page.requests, page.errors = [], []
    page.on("request", lambda r: page.requests.append(r.url))
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
    yield page
    page.screenshot(path=str(tmp_path / "last.png"), full_page=True)
    context.close()


def _off_server(page: Any, server: str) -> list[str]:
    return [u for u in page.requests if not u.startswith((f"{server}/", "data:", "blob:"))]


def test_swagger_ui_draws_the_operations_from_the_server_alone(page: Any, server: str) -> None:
    page.goto(f"{server}/docs")
    page.wait_for_selector(".opblock", timeout=20_000)
    assert page.locator(".opblock").count() > 20  # every API operation, one block each
    assert "/api/v1/jobs" in page.inner_text("#swagger-ui")
    assert _off_server(page, server) == []
    assert page.errors == []


def test_redoc_leads_to_the_swagger_page(page: Any, server: str) -> None:
    page.goto(f"{server}/redoc")
    page.wait_for_selector(".opblock", timeout=20_000)
    assert page.url == f"{server}/docs"
    assert _off_server(page, server) == []
    assert page.errors == []


def test_docs_page_allows_no_inline_script(server: str) -> None:
    reply = httpx.get(f"{server}/docs")
    assert reply.status_code == 200
    csp = reply.headers.get("content-security-policy", "")
    script_src = next((d for d in csp.split(";") if d.strip().startswith("script-src")), "")
    assert script_src.split() == ["script-src", "'self'"], csp
    assert "<script>" not in reply.text  # every script is a file the server serves

"""README's deployment and alerting text says what exists: how to start the compose file,
how collectors get a token, and where an ``alertmanager``-format receiver points."""

from __future__ import annotations

import json
import re

from tests.deploy.compose import ROOT, required_variables

README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(f"\n### {title}\n")
    end = README.find("\n#", start + len(title) + 6)
    return README[start:end]


def test_compose_section_says_how_to_start_and_how_collectors_get_a_token():
    assert "\n### With Docker Compose\n" in README, "README has no compose section"
    text = _section("With Docker Compose")
    assert "cp .env.example .env" in text
    for name in sorted(required_variables()):
        assert name in text, f"the compose section does not name {name}"
    assert "vigil token create --scope ingest" in text  # run in the api container
    assert "/api/v1/tokens" in text
    assert "VIGIL_TOKEN=" in text and "VIGIL_ENDPOINT=" in text  # what a collector is given
    assert "#health-readiness-and-faults" in text  # linked, not repeated


def test_alertmanager_format_examples_point_at_a_receiver_not_alertmanager():
    """Alertmanager accepts alerts at ``/api/v2/alerts`` in another shape and has no
    ``alerts-webhook``; the ``alertmanager`` format is what Alertmanager *sends*."""
    bodies = re.findall(r"-d '(\{.*?\})'", README, re.DOTALL)
    examples = [b for b in map(json.loads, bodies) if b.get("format") == "alertmanager"]
    assert examples, "README shows no alertmanager-format receiver"
    for body in examples:
        url = body["url"]
        assert "/api/v2/" not in url and ":9093" not in url, f"{url} is Alertmanager itself"
    assert "alerts-webhook" not in README

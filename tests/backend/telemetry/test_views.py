"""The chart routes document their responses in OpenAPI, and answer as documented."""

from __future__ import annotations

import pytest

from tests.frontend.helpers import JOB, ingest_job

CHART_ROUTES = {
    "/api/v1/jobs/{job}/heatmap": "Heatmap",
    "/api/v1/jobs/{job}/series": "Series",
    "/api/v1/jobs/{job}/bandwidth": "Bandwidth",
    "/api/v1/jobs/{job}/overview": "JobOverview",
    "/api/v1/incidents/{incident_id}/evidence-chart": "EvidenceChart",
}


@pytest.fixture(scope="module")
def openapi():  # type: ignore[no-untyped-def]
    from backend.api import create_app
    from backend.settings import Settings

    app = create_app(Settings(database_url="sqlite://", env="development", detect_interval_s=0))
    return app.openapi()


@pytest.mark.parametrize(("path", "model"), CHART_ROUTES.items())
def test_chart_routes_have_response_schemas(openapi, path, model):
    ok = openapi["paths"][path]["get"]["responses"]["200"]
    assert ok["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{model}"}
    assert openapi["components"]["schemas"][model]["properties"]


def test_heatmap_schema_says_what_z_holds(openapi):
    schemas = openapi["components"]["schemas"]
    heatmap = schemas["Heatmap"]["properties"]
    assert {"x", "y", "z", "rank_bin", "step_bin", "sampled_steps_per_bin", "rollup"} <= set(
        heatmap
    )
    assert heatmap["value"]["const"] == "compute_s"
    mark = schemas["IncidentMark"]["properties"]["detected_at"]
    assert mark == {"type": "string", "format": "date-time", "title": "Detected At"}


def test_keys_a_chart_leaves_out_stay_out(client):
    ingest_job(client, ranks=2, steps=range(20))
    heatmap = client.get(f"/api/v1/jobs/{JOB}/heatmap").json()
    assert "rollup" not in heatmap and heatmap["sampled_steps_per_bin"] is None
    assert heatmap["ranks"] == 2 and heatmap["agg"] == "avg"
    overview = client.get(f"/api/v1/jobs/{JOB}/overview").json()
    assert overview["job"]["created_at"].endswith("+00:00")  # isoformat(), as before
    assert overview["goodput"]["as_of"].endswith("+00:00")
    assert "steps_productive" in overview["goodput"]

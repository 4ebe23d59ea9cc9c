"""The collector is a guest in the training process: importing it pulls in nothing of
the backend and none of the server's dependencies."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

COLLECTOR = Path(__file__).resolve().parents[2] / "collector"
SERVER_DEPS = (
    "backend",
    "fastapi",
    "starlette",
    "sqlalchemy",
    "alembic",
    "pydantic",
    "psycopg",
    "celery",
    "redis",
    "uvicorn",
    "orjson",
    "typer",
    "rich",
    "httpx",
    "prometheus_client",
    "jinja2",
    "plotly",
    "numpy",
    "scipy",
)


def test_import_collector_loads_no_backend_or_server_dependency():
    code = (
        "import sys, json; import collector; "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    assert "collector" in loaded
    assert not loaded & set(SERVER_DEPS), f"collector imported {loaded & set(SERVER_DEPS)}"


def test_collector_sources_import_only_stdlib_torch_and_itself():
    allowed = set(sys.stdlib_module_names) | {"torch", "collector", "__future__"}
    offenders = []
    for path in COLLECTOR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] not in allowed]
    assert offenders == []

"""``detectors/`` is pure: arrays and bytes in, findings out. No database, clock, network or
file system, and nothing of the backend, so every detector runs on recorded data anywhere.

Two checks, like the collector's isolation test: the source of every module imports only
from an allow-list and calls nothing that reads files or the clock; and importing every
module loads none of the server's dependencies.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DETECTORS = ROOT / "detectors"
SOURCES = sorted(DETECTORS.rglob("*.py"))

# The standard library's pure parts, numpy and scipy, and the package itself.
ALLOWED = frozenset(
    {
        "__future__",
        "collections",
        "dataclasses",
        "typing",
        "math",
        "re",
        "json",
        "io",  # BytesIO around in-memory bytes, for pickle
        "pickle",
        "itertools",
        "functools",
        "statistics",
        "enum",
        "heapq",
        "bisect",
        "numpy",
        "scipy",
        "detectors",
    }
)
# The registry imports the package's own modules, so a detector registers by being there.
ALLOWED_IN = {"registry.py": frozenset({"importlib", "pkgutil"})}
DENIED = frozenset(
    {
        "os",
        "sys",
        "pathlib",
        "time",
        "datetime",
        "socket",
        "subprocess",
        "threading",
        "urllib",
        "http",
        "requests",
        "httpx",
        "sqlalchemy",
        "redis",
        "celery",
        "fastapi",
        "backend",
        "collector",
        "shutil",
        "tempfile",
        "glob",
        "random",
    }
)
# Builtins that reach files, code or the terminal's input.
DENIED_CALLS = frozenset({"open", "exec", "eval", "compile", "__import__", "input"})
# numpy's file I/O and its unseeded randomness.
DENIED_NUMPY = frozenset(
    {"load", "save", "savez", "savez_compressed", "loadtxt", "savetxt", "genfromtxt"}
    | {"fromfile", "memmap", "random"}
)
# What a module of the server (not a detector) would pull in at import time. numpy and scipy
# themselves load os, socket and threading, so those cannot be checked this way; the source
# scan above covers them.
SERVER_MODULES = (
    "backend",
    "collector",
    "sqlalchemy",
    "alembic",
    "psycopg",
    "fastapi",
    "starlette",
    "pydantic",
    "redis",
    "celery",
    "kombu",
    "httpx",
    "requests",
    "urllib3",
    "urllib.request",
    "http.client",
)


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level module) of every import, nested ones included."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = "detectors" if node.level else (node.module or "").split(".")[0]
            found.append((node.lineno, module))
    return found


def _impure_calls(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every use of the file system, the clock or code loading."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in DENIED_CALLS
        ):
            found.append((node.lineno, f"calls {node.func.id}()"))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner, attr = node.value.id, node.attr
            if owner == "time":
                found.append((node.lineno, f"reads the clock: time.{attr}"))
            elif owner in ("datetime", "date") and attr in ("now", "utcnow", "today"):
                found.append((node.lineno, f"reads the clock: {owner}.{attr}"))
            elif owner in ("np", "numpy") and attr in DENIED_NUMPY:
                found.append((node.lineno, f"uses {owner}.{attr}"))
        elif isinstance(node, ast.Attribute) and node.attr == "tofile":
            found.append((node.lineno, "writes a file: .tofile"))
    return found


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


def test_every_detector_module_is_scanned() -> None:
    names = {p.name for p in SOURCES}
    assert {"__init__.py", "finding.py", "flight_recorder.py", "registry.py"} <= names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(DETECTORS)))
def test_imports_only_pure_modules(path: Path) -> None:
    allowed = ALLOWED | ALLOWED_IN.get(path.name, frozenset())
    offenders = []
    for line, module in _imports(ast.parse(path.read_text(), filename=str(path))):
        if module in DENIED:
            offenders.append(f"{_where(path, line)}: imports {module} (denied: not pure)")
        elif module not in allowed:
            offenders.append(f"{_where(path, line)}: imports {module} (not in the allow-list)")
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(DETECTORS)))
def test_no_file_clock_or_code_loading_calls(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    offenders = [f"{_where(path, line)}: {what}" for line, what in _impure_calls(tree)]
    assert not offenders, "\n".join(offenders)


def test_importing_every_detector_loads_no_server_dependency() -> None:
    code = (
        "import importlib, json, pkgutil, sys\n"
        "import detectors\n"
        "names = [m.name for m in pkgutil.walk_packages(detectors.__path__, 'detectors.')]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps({'imported': names, 'loaded': sorted(sys.modules)}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout)
    expected = {
        ".".join(("detectors", *p.relative_to(DETECTORS).with_suffix("").parts))
        for p in SOURCES
        if p.name != "__init__.py"
    } | {  # sub-packages (detectors/swap/) are modules too
        ".".join(("detectors", *p.parent.relative_to(DETECTORS).parts))
        for p in SOURCES
        if p.name == "__init__.py" and p.parent != DETECTORS
    }
    assert set(result["imported"]) == expected
    loaded = set(result["loaded"])
    server = [m for m in SERVER_MODULES if m in loaded]
    assert server == [], f"importing detectors loaded {server}"

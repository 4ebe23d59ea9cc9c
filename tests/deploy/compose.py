"""Read ``docker-compose.yml`` as Compose would, without a Docker engine.

``resolve`` applies Compose's variable interpolation (``${VAR}``, ``$VAR``, ``${VAR:-d}``,
``${VAR-d}``, ``${VAR:?msg}``, ``${VAR?msg}``, ``${VAR:+alt}``, ``${VAR+alt}``, ``$$``) to
every string value of the parsed file (PyYAML resolves the ``<<: *vigil`` merges); a
required variable that is missing raises ``MissingVariable`` with the file's message, as
``docker compose`` refuses to start. ``local_argv`` turns a container's command into the
same command on this machine (the image's ``vigil`` and ``python`` are this venv's).

    env = read_env_file(ENV_EXAMPLE) | {"VIGIL_ADMIN_TOKEN": "…"}
    services = resolve(load_compose(), env)["services"]
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
DOCKERFILE = ROOT / "Dockerfile"
VIGIL_SERVICES = ("migrate", "api", "worker", "beat")  # the services running the Vigil image

_VAR = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
    r"|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<invalid>))"
)


class MissingVariable(ValueError):
    """A ``${VAR:?message}`` (or ``${VAR?message}``) whose variable is not set."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"required variable {name} is missing a value: {message}")
        self.name = name


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """One string, interpolated the way Compose does."""

    def sub(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        if match["bare"]:
            return env.get(match["bare"], "")
        name, op, arg = match["name"], match["op"], match["arg"] or ""
        if name is None:
            raise ValueError(f"invalid interpolation in {value!r}")
        present = name in env
        usable = present and env[name] != ""
        if op is None:
            return env.get(name, "")
        is_set = usable if op.startswith(":") else present
        kind = op[-1]
        if kind == "-":
            return env[name] if is_set else interpolate(arg, env)
        if kind == "?":
            if not is_set:
                raise MissingVariable(name, arg)
            return env[name]
        return interpolate(arg, env) if is_set else ""  # "+"

    return _VAR.sub(sub, value)


def resolve(node: Any, env: Mapping[str, str]) -> Any:
    """Interpolate every string value (not keys) of a parsed Compose document."""
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [resolve(item, env) for item in node]
    if isinstance(node, dict):
        return {key: resolve(item, env) for key, item in node.items()}
    return node


def load_compose(path: Path = COMPOSE) -> dict[str, Any]:
    """The file as parsed YAML (anchors and ``<<`` merges applied), not yet interpolated."""
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict), f"{path} is not a mapping"
    return document


def read_env_file(path: Path = ENV_EXAMPLE) -> dict[str, str]:
    """``KEY=VALUE`` lines of a Compose ``.env`` file (comments and blank lines skipped)."""
    values: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}:{number}: not KEY=VALUE: {raw!r}"
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def required_variables(path: Path = COMPOSE) -> set[str]:
    """Variables the file refuses to start without (``${VAR:?…}`` / ``${VAR?…}``)."""
    return {m["name"] for m in _VAR.finditer(path.read_text()) if (m["op"] or "").endswith("?")}


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's ``environment``, as a mapping, whichever of the two forms it uses."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def local_argv(argv: list[str], ports: Mapping[str, str]) -> list[str]:
    """A container's command (or ``CMD`` healthcheck) as the same command here: ``vigil``
    and ``python`` from this venv, container ports to the local ones, ``0.0.0.0`` (all of
    the container's own interfaces) to loopback."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if i == 0 and arg == "vigil":
            out += [sys.executable, "-m", "backend"]
            continue
        if i == 0 and arg in ("python", "python3"):
            out.append(sys.executable)
            continue
        arg = "127.0.0.1" if arg == "0.0.0.0" else arg
        for inside, outside in ports.items():
            arg = outside if arg == inside else re.sub(rf"(?<=:){inside}\b", outside, arg)
        out.append(arg)
    return out


def container_ports(service: Mapping[str, Any]) -> list[str]:
    """The container side of each ``ports`` entry (``"8000:8000"`` → ``"8000"``)."""
    found = []
    for entry in service.get("ports") or []:
        text = str(entry["target"] if isinstance(entry, dict) else entry)
        found.append(text.split("/")[0].rsplit(":", 1)[-1])
    return found

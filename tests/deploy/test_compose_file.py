"""``docker-compose.yml`` without a Docker engine: what it requires, how it is wired, and
(where Compose is installed) that Compose itself accepts it with the documented ``.env``.

The services themselves are started as local processes in ``test_compose_run.py``.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.compose import (
    COMPOSE,
    DOCKERFILE,
    ENV_EXAMPLE,
    VIGIL_SERVICES,
    MissingVariable,
    environment,
    interpolate,
    load_compose,
    read_env_file,
    required_variables,
    resolve,
)

SECRETS = ("VIGIL_ADMIN_TOKEN", "VIGIL_INGEST_TOKEN", "VIGIL_SECRET_KEY")


def filled_example() -> dict[str, str]:
    """``.env.example`` with what Compose requires filled in and nothing else: the least a
    user can get past ``docker compose up`` with, which must then start."""
    required = required_variables()
    env = read_env_file(ENV_EXAMPLE)
    return {k: v or (secrets.token_urlsafe(24) if k in required else v) for k, v in env.items()}


def test_interpolation_follows_compose():
    env = {"SET": "x", "EMPTY": ""}
    assert interpolate("${SET:-d}/${EMPTY:-d}/${UNSET:-d}/${EMPTY-d}", env) == "x/d/d/"
    assert interpolate("$SET ${SET} $$SET ${SET:+alt} ${EMPTY:+alt}", env) == "x x $SET alt "
    assert interpolate("${EMPTY?m}", env) == ""
    with pytest.raises(MissingVariable, match=r"EMPTY.*say why"):
        interpolate("${EMPTY:?say why}", env)
    with pytest.raises(MissingVariable, match="UNSET"):
        interpolate("${UNSET?m}", env)


@pytest.mark.parametrize("name", SECRETS)
def test_refuses_to_resolve_without_each_secret(name):
    """Unset or left empty (``cp .env.example .env`` unedited): refused, naming the
    variable, before anything starts; never a silently empty secret."""
    assert ENV_EXAMPLE.exists(), ".env.example documents the deployment's variables"
    assert name in read_env_file(ENV_EXAMPLE), f"{name} is not in .env.example"
    assert name in required_variables(), f"docker-compose.yml does not require {name}"
    env = filled_example()
    for missing in ({k: v for k, v in env.items() if k != name}, {**env, name: ""}):
        with pytest.raises(MissingVariable) as refused:
            resolve(load_compose(), missing)
        assert refused.value.name == name
    assert resolve(load_compose(), env)  # and with all of them set, it resolves


def test_unedited_example_is_refused():
    with pytest.raises(MissingVariable):
        resolve(load_compose(), read_env_file(ENV_EXAMPLE))


def test_every_variable_the_file_reads_is_documented():
    used = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", COMPOSE.read_text()))
    assert used <= set(read_env_file(ENV_EXAMPLE)), used - set(read_env_file(ENV_EXAMPLE))


def test_one_image_built_once_and_services_wired():
    services = resolve(load_compose(), filled_example())["services"]
    images = {services[name].get("image") for name in VIGIL_SERVICES}
    assert len(images) == 1 and None not in images, f"one image for all of them: {images}"
    builders = [name for name, svc in services.items() if "build" in svc]
    assert builders == ["migrate"], f"the image is built once, by migrate: {builders}"
    for name in VIGIL_SERVICES:
        env = environment(services[name])
        assert env["VIGIL_ENV"] == "production"
        assert all(env.get(s) for s in SECRETS), f"{name} lacks a secret"
    migrate_deps = services["migrate"]["depends_on"]
    assert {migrate_deps[s]["condition"] for s in ("postgres", "redis")} == {"service_healthy"}
    assert services["migrate"]["restart"] == "no"
    for name in ("api", "worker", "beat"):
        svc = services[name]
        assert svc["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert svc["restart"] == "unless-stopped"
        assert svc["healthcheck"]["test"][0] == "CMD"
    assert "/readyz" in " ".join(services["api"]["healthcheck"]["test"])
    for role in ("worker", "beat"):
        check = services[role]["healthcheck"]["test"]
        assert check[1:] == ["python", "-m", "backend.readiness", role]


def test_image_runs_as_an_unprivileged_user():
    users = re.findall(r"^\s*USER\s+(\S+)", DOCKERFILE.read_text(), re.MULTILINE)
    assert users, "Dockerfile has no USER: the image runs as root"
    assert users[-1].split(":")[0] not in ("root", "0"), users[-1]


def _compose_cli() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


def test_docker_compose_config_accepts_the_documented_env(tmp_path: Path):
    cli = _compose_cli()
    if cli is None:
        pytest.skip("needs Compose: apt-get install docker-compose (Debian) or docker compose")
    shell = {k: v for k, v in os.environ.items() if not k.startswith(("VIGIL_", "COMPOSE_"))}

    def config(env_file: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cli, "--env-file", str(env_file), "-f", str(COMPOSE), "config", "-q"],
            env=shell,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )

    good = tmp_path / "filled.env"
    good.write_text("".join(f"{k}={v}\n" for k, v in filled_example().items()))
    done = config(good)
    assert done.returncode == 0, done.stdout + done.stderr
    refused = config(ENV_EXAMPLE)  # copied and not edited
    assert refused.returncode != 0
    assert "VIGIL_" in refused.stdout + refused.stderr


def test_env_file_stays_out_of_git_and_of_the_build_context():
    root = COMPOSE.parent
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=root, timeout=30)
    if ignored.returncode == 128:
        pytest.skip("not a git checkout")
    assert ignored.returncode == 0, ".env (the deployment's secrets) is not git-ignored"
    assert ".env" in (root / ".dockerignore").read_text().split()

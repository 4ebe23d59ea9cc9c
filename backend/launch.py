"""``vigil run -- <command>``: launch any command with the collector configured.

The child gets ``VIGIL_ENDPOINT``, ``VIGIL_TOKEN``, ``VIGIL_JOB``, ``VIGIL_RUN_ID`` (this
launch's id, made here unless already set: running the same job again is a new run of it,
``backend.jobs.runs``), ``VIGIL_CHAOS`` when asked, and ``collector/_autoinit`` on
``PYTHONPATH``, whose ``sitecustomize`` calls ``collector.init()`` in each rank, so an
unmodified training script reports too (steps come from the optimizer hook). Signals reach
the child; its exit code is returned.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from contextlib import suppress
from pathlib import Path

import collector

AUTOINIT_DIR = Path(collector.__file__).resolve().parent / "_autoinit"
LAUNCHERS = re.compile(r"(^|/)torchrun$|torch\.distributed\.(run|launch)")


def child_env(
    command: list[str],
    *,
    endpoint: str,
    token: str,
    job: str | None,
    chaos: str | None,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["VIGIL_ENDPOINT"] = endpoint
    if token:
        env["VIGIL_TOKEN"] = token
    env["VIGIL_JOB"] = job or env.get("VIGIL_JOB") or default_job_name(command)
    env["VIGIL_RUN_ID"] = env.get("VIGIL_RUN_ID") or new_run_id()
    if chaos:
        env["VIGIL_CHAOS"] = chaos
    launcher = any(LAUNCHERS.search(part) for part in command[:3])
    env["VIGIL_AUTOINIT"] = "ranks" if launcher else "1"
    env.pop("VIGIL_AUTOINIT_DONE", None)
    # The folder holding `collector` too, for commands run outside this environment.
    roots = [str(AUTOINIT_DIR), str(AUTOINIT_DIR.parent.parent)]
    env["PYTHONPATH"] = os.pathsep.join([*roots, *filter(None, [env.get("PYTHONPATH")])])
    return env


def new_run_id() -> str:
    """A launch's id: when it started, and a random part (launches may start together)."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


def default_job_name(command: list[str]) -> str:
    scripts = [Path(p).stem for p in command if p.endswith(".py")]
    name = scripts[0] if scripts else Path(command[0]).name
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def launch(
    command: list[str], *, endpoint: str, token: str, job: str | None, chaos: str | None
) -> int:
    if not command:
        raise SystemExit("vigil run: give the command after --, e.g. vigil run -- torchrun …")
    env = child_env(command, endpoint=endpoint, token=token, job=job, chaos=chaos)
    print(
        f"vigil: job {env['VIGIL_JOB']!r} (run {env['VIGIL_RUN_ID']}) reporting to {endpoint}",
        flush=True,
    )
    try:
        proc = subprocess.Popen(command, env=env)
    except FileNotFoundError:
        print(f"vigil run: command not found: {command[0]}", flush=True)
        return 127
    forward = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, lambda sig, _f: proc.send_signal(sig)) for s in forward}
    try:
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants (torchrun starts ranks in new sessions,
    so killing the launcher's process group alone leaves hung ranks behind)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    doomed, stack = [], [pid]
    while stack:
        current = stack.pop()
        doomed.append(current)
        stack.extend(children.get(current, []))
    for victim in doomed:
        with suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)

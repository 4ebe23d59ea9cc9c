"""A real collector process for the reliability tests: a short training-like loop that
uses ``import collector as vigil`` exactly as a user script does.

    proc = start_job(base, job="j", steps=400, poison_at=20)      # or steps=0: until stopped
    stats = finish_job(proc)                                         # vigil.stats() at exit

Environment knobs: ``JOB_STEPS`` (0 runs until the file ``JOB_STOP_FILE`` exists),
``JOB_STEP_S`` (sleep per step), ``JOB_POISON_AT`` (the step that records
``vigil.event("checkpoint_saved\\x00")``). The script prints ``vigil.stats()`` as JSON on
its last line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPT = """
import json, os, time
import collector as vigil

vigil.init(integrations=False)
steps = int(os.environ.get("JOB_STEPS", "0"))
step_s = float(os.environ.get("JOB_STEP_S", "0.02"))
poison_at = int(os.environ.get("JOB_POISON_AT", "-1"))
stop_file = os.environ.get("JOB_STOP_FILE", "")
n = 0
while (n < steps) if steps else not os.path.exists(stop_file):
    with vigil.step(n):
        time.sleep(step_s)
        if n == poison_at:
            vigil.event("checkpoint_saved\\x00", path="/ckpt/step-%d" % n)
    vigil.log(loss=1.0 / (n + 1))
    n += 1
flushed = vigil.flush(timeout=30)
stats = vigil.stats() if hasattr(vigil, "stats") else {}  # (older collectors lack it)
print(json.dumps({"flushed": flushed, "steps": n, **stats}), flush=True)
"""

ROOT = Path(__file__).resolve().parents[2]


def start_job(
    base: str, *, job: str, workdir: Path, **knobs: str | int | float
) -> subprocess.Popen[str]:
    script = workdir / "collector_job.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIGIL_", "JOB_"))}
    env.update(
        {
            "VIGIL_ENDPOINT": base,
            "VIGIL_TOKEN": "vigil-dev-ingest",
            "VIGIL_JOB": job,
            "PYTHONPATH": str(ROOT),
        }
    )
    env.update({k: str(v) for k, v in knobs.items()})
    return subprocess.Popen(
        [sys.executable, str(script)],
        env=env,
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish_job(proc: subprocess.Popen[str], timeout: float = 60) -> dict[str, Any]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"the collector job did not finish in {timeout} s:\n{out}") from None
    assert proc.returncode == 0, out
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, out
    result: dict[str, Any] = json.loads(lines[-1])
    return result

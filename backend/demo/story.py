"""``vigil demo``: a real faulty training job, diagnosed and healed while you watch.

Vigil starts embedded; a 4-rank GPT-style model trains over gloo under
``vigil run -- torchrun --max-restarts=3`` with faults injected by ``VIGIL_CHAOS``:

1. rank 2 turns into a straggler for a while (it computes slower; the others wait);
2. the loss turns NaN (poisoned gradients) → the recovery policy rolls back: the bad
   checkpoints are set aside and torchrun restarts the group from the last good one;
3. in that restarted attempt rank 1 hangs (it never enters the next collective) →
   the policy restarts the group, which resumes from its checkpoint and finishes.

The full demo ends with a last act (``backend.demo.swap_story``): a job whose sequence
length changes mid-training gets an activation-swap policy from Vigil.

The terminal follows the story (a progress bar, a line per incident and action); the end
is a table of every injected fault: when it started, when Vigil flagged it, the ranks it
named, the action taken and whether the job recovered. The exit code is 0 when every
fault was flagged with the right ranks and the job finished.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from backend.demo.report import Fault, summarize
from backend.demo.server import DemoServer, DemoServerError, embedded_server
from backend.demo.swap_story import play_swap
from backend.launch import kill_tree

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_tiny_gpt.py"


@dataclass(frozen=True)
class Scenario:
    """The job and its faults. ``fast`` finishes in about a minute and a half on 2 cores."""

    steps: int
    ranks: int
    ckpt_every: int
    model: tuple[str, ...]
    straggler: tuple[int, int, int, float]  # rank, from step, to step, extra seconds per step
    nan_at: int
    hang: tuple[int, int]  # rank, step (in the attempt after the rollback)

    def chaos(self) -> str:
        rank, start, end, delay = self.straggler
        hang_rank, hang_at = self.hang
        return (
            f"straggler:rank={rank},from_step={start},to_step={end},delay_s={delay};"
            f"nan:at_step={self.nan_at};"
            f"hang:rank={hang_rank},at_step={hang_at},attempt=1"
        )

    def faults(self) -> list[Fault]:
        rank, start, end, _ = self.straggler
        hang_rank, hang_at = self.hang
        return [
            Fault("straggler", "straggler", (rank,), start, 0, f"rank {rank}, steps {start}–{end}"),
            Fault("nan", "nan", tuple(range(self.ranks)), self.nan_at, 0, "NaN loss, every rank"),
            Fault("hang", "hang", (hang_rank,), hang_at, 1, f"rank {hang_rank} stops"),
        ]


FAST = Scenario(
    # Room after each fault: a rank exiting for a restart may take its exit timeout
    # (VIGIL_EXIT_TIMEOUT_S, 2 s) to flush, and this tiny job makes ~20 steps a second;
    # and enough of the run left after the hang (~285 steps) that a restart pays.
    steps=400,
    ranks=4,
    ckpt_every=10,
    model=("--dim", "32", "--layers", "1", "--seq", "32", "--batch", "4"),
    straggler=(2, 20, 60, 0.15),
    nan_at=75,
    hang=(1, 115),
)
FULL = Scenario(
    steps=600,
    ranks=4,
    ckpt_every=25,
    model=("--dim", "64", "--layers", "2", "--seq", "64", "--batch", "8"),
    straggler=(2, 60, 200, 0.15),
    nan_at=300,
    hang=(1, 450),
)

# Hangs, crashes and NaNs are acted on at once (quick guards, for the demo's pace);
# a straggler only gets a proposal that waits for a person (approve it on its page).
# The cost model weighs each choice over what is left of the job, which says its planned
# length (``job_env``), at what a restart of this tiny job costs: seconds (``restart_s``),
# not the default two minutes; ``min_gain_s`` is scaled down alike.
COSTS = {"restart_s": 5, "min_gain_s": 1}
POLICIES = {
    "*": {"mode": "auto", "params": {"cooldown_s": 5, "max_restarts_per_hour": 10, **COSTS}},
    "straggler": {"mode": "approve", "params": COSTS},
}


def run_story(*, console: Console, port: int, database_url: str, fast: bool) -> int:
    scenario = FAST if fast else FULL
    logging.getLogger("backend").setLevel(logging.ERROR)  # the story is told below
    job = f"tiny-gpt-{time.strftime('%H%M%S')}"
    workdir = Path("var") / job
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        with embedded_server(
            database_url=database_url,
            port=port,
            detect_interval_s=0.5,
            sweep_interval_s=0.5,
        ) as vigil:
            console.print(
                f"[bold]Vigil demo[/bold] · embedded, database {database_url}\n"
                f"dashboard  {vigil.base}/jobs/{job}\n"
                f"API        {vigil.base}/docs   (token {vigil.token('admin')})\n"
                f"job log    {workdir / 'job.log'}\n"
                f"faults     VIGIL_CHAOS={scenario.chaos()}"
            )
            ok = _play(console, vigil, job, scenario, workdir)
            if not fast:  # the last act: op-sequence drift and a swap policy (about a minute)
                console.print("\n[bold]Last act: a job whose op sequence drifts[/bold]")
                ok = play_swap(console, vigil) and ok
                console.print(f"\nServing {vigil.base}/jobs/{job} until Ctrl-C.")
                vigil.serve_until_interrupted()
            return 0 if ok else 1
    except DemoServerError as exc:
        console.print(f"[red]{exc}[/red]")
        return 1


def _play(console: Console, vigil: DemoServer, job: str, sc: Scenario, workdir: Path) -> bool:
    admin = {"Authorization": f"Bearer {vigil.token('admin')}"}
    with httpx.Client(base_url=f"{vigil.base}/api/v1", headers=admin, timeout=30) as api:
        for kind, policy in POLICIES.items():
            api.put(f"/jobs/{job}/policies/{kind}", json=policy).raise_for_status()
        proc = _launch(vigil, job, sc, workdir)
        try:
            return _follow(console, api, job, sc, proc)
        finally:
            if proc.poll() is None:  # interrupted: leave no training process behind
                kill_tree(proc.pid)
                proc.wait()


def _follow(
    console: Console, api: httpx.Client, job: str, sc: Scenario, proc: subprocess.Popen[bytes]
) -> bool:
    started = time.monotonic()
    follower = _Follower(api, job, console)
    with Progress(
        TextColumn("[bold]training[/bold] {task.fields[note]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        bar = progress.add_task("train", total=sc.steps, note="")
        follower.console = progress.console
        while proc.poll() is None:
            follower.poll(progress, bar)
            time.sleep(0.5)
        # Let the last reports land and the last incidents resolve.
        settle = time.monotonic() + 15
        while time.monotonic() < settle and follower.poll(progress, bar):
            time.sleep(0.5)
    elapsed = time.monotonic() - started
    console.print(
        f"job exited with code {proc.returncode} after {elapsed:.0f} s "
        f"(attempts: {follower.attempt + 1})"
    )
    return summarize(api, job, sc.faults(), proc.returncode, console)


def _launch(vigil: DemoServer, job: str, sc: Scenario, workdir: Path) -> subprocess.Popen[bytes]:
    command = [
        *(sys.executable, "-m", "backend", "run", "--job", job, "--endpoint", vigil.base),
        *("--token", vigil.token("ingest"), "--chaos", sc.chaos(), "--"),
        *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
        *("--nproc-per-node", str(sc.ranks), "--max-restarts", "3", str(EXAMPLE)),
        *("--steps", str(sc.steps), "--ckpt-dir", str(workdir / "ckpt")),
        *("--ckpt-every", str(sc.ckpt_every), *sc.model),
    ]
    log = (workdir / "job.log").open("wb")
    return subprocess.Popen(command, env=job_env(sc), stdout=log, stderr=subprocess.STDOUT)


def job_env(sc: Scenario) -> dict[str, str]:
    """The job's environment: heartbeats twice a second, one thread per rank, and its
    planned length (``VIGIL_TOTAL_STEPS``: the collector sends it as a ``run_plan``), so
    recovery estimates weigh what is left of this short job, not an assumed 10 hours."""
    plan = {"VIGIL_HEARTBEAT_S": "0.5", "OMP_NUM_THREADS": "1", "VIGIL_TOTAL_STEPS": str(sc.steps)}
    return {**os.environ, **plan}


class _Follower:
    """Polls the REST API and prints a line per new incident, action and state change."""

    def __init__(self, api: httpx.Client, job: str, console: Console) -> None:
        self.api, self.job, self.console = api, job, console
        self.seen: dict[str, str] = {}
        self.attempt = 0

    def poll(self, progress: Progress, bar: object) -> bool:
        """One look; returns True while something is still open or in flight."""
        try:
            info = self.api.get(f"/jobs/{self.job}")
            if info.status_code == 404:
                return True  # the job has not reported yet
            info.raise_for_status()
            incidents = self.api.get(f"/jobs/{self.job}/incidents").raise_for_status().json()
            actions = self.api.get(f"/jobs/{self.job}/actions").raise_for_status().json()
        except httpx.HTTPError:
            return True
        if info.status_code == 200:
            body = info.json()
            self.attempt = body["attempt"]
            note = f"attempt {body['attempt']}" if body["attempt"] else ""
            progress.update(bar, completed=(body["last_step"] or 0) + 1, note=note)  # type: ignore[arg-type]
        for i in reversed(incidents):
            self._incident(i)
        for a in reversed(actions):
            self._action(a)
        busy = any(i["status"] == "open" for i in incidents) or any(
            a["state"] in ("pending", "dispatched", "acked") for a in actions
        )
        return busy

    def _say(self, key: str, state: str, line: str) -> None:
        if self.seen.get(key) != state:
            self.seen[key] = state
            self.console.print(f"{time.strftime('%H:%M:%S')}  {line}")

    def _incident(self, i: dict) -> None:  # type: ignore[type-arg]
        ranks = ", ".join(map(str, i["ranks"])) or "—"
        if i["status"] == "open" or f"i{i['id']}" not in self.seen:
            colour = "red" if i["severity"] == "critical" else "yellow"
            self._say(
                f"i{i['id']}",
                "open",
                f"[{colour}]incident #{i['id']} {i['kind']}[/{colour}] ranks {ranks} "
                f"since step {i['first_step']}: {i['summary']}",
            )
        if i["status"] == "resolved":
            self._say(f"i{i['id']}", "resolved", f"[green]resolved #{i['id']} {i['kind']}[/green]")

    def _action(self, a: dict) -> None:  # type: ignore[type-arg]
        who = a["requested_by"]
        if a["state"] == "proposed":
            line = f"[cyan]proposed {a['kind']}[/cyan] for incident #{a['incident_id']} "
            line += f"(waiting for approval): {a['reason']}"
        elif a["state"] in ("pending", "dispatched", "acked"):
            line = f"[cyan]action {a['kind']}[/cyan] ({who}) for incident #{a['incident_id']}: "
            line += a["reason"] or ""
            self._say(f"a{a['id']}", "open", line)
            return
        else:
            done = len([d for d in a["deliveries"].values() if d["state"] == a["state"]])
            line = f"[cyan]action {a['kind']} {a['state']}[/cyan] on {done} rank(s)"
        self._say(f"a{a['id']}", a["state"], line)

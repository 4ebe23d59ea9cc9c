"""``vigil demo --swap``: a job whose op sequence drifts, and the activation-swap policy Vigil
pushes for it, while you watch.

Vigil starts embedded; a 2-rank GPT-style model trains over gloo on CPU with a
sequence-length curriculum (64, then 128 from step 40) under a per-rank memory budget that
the 128-token step does not fit unmodified (:mod:`backend.demo.swap_drift`, the scenario the
end-to-end test runs too). The terminal follows the loop: the drift detected (an
``opseq_change`` incident), the policy pushed (how many saved tensors it offloads, its
predicted peak), the step each rank applied it from, then a table of measured against
predicted peak and budget. About a minute; the exit code is 0 when the drift was flagged
within 10 steps of the change, every rank applied the policy and the measured peak kept to
the budget. It is also the last act of the full ``vigil demo`` (``make demo``).
"""

from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from backend.demo.server import DemoServer, DemoServerError, embedded_server
from backend.demo.swap_drift import DriftScenario, Seen, launch, memory_budget, modelled_peaks
from backend.demo.swap_drift import observe as observe_drift
from backend.launch import kill_tree
from backend.swap.report import human_bytes

DETECT_WITHIN = 10  # steps after the change (issue 14's bar for opseq_change's first_step)


def run_swap_story(*, console: Console, port: int, database_url: str, fast: bool) -> int:
    """The demo on its own: an embedded Vigil, the drifting job, the table; 0 when the loop
    closed. Without ``fast`` the server keeps serving until Ctrl-C."""
    logging.getLogger("backend").setLevel(logging.ERROR)  # the story is told below
    try:
        with embedded_server(
            database_url=database_url, port=port, detect_interval_s=0.5, sweep_interval_s=0.5
        ) as vigil:
            console.print(
                f"[bold]Vigil demo: activation swapping[/bold] · embedded, database "
                f"{database_url}\nAPI        {vigil.base}/docs   (token {vigil.token('admin')})"
            )
            ok = play_swap(console, vigil)
            if not fast:
                console.print(f"\nServing {vigil.base} until Ctrl-C.")
                vigil.serve_until_interrupted()
            return 0 if ok else 1
    except DemoServerError as exc:
        console.print(f"[red]{exc}[/red]")
        return 1


def play_swap(console: Console, vigil: DemoServer, scenario: DriftScenario | None = None) -> bool:
    """Run the drifting job against ``vigil`` and tell what happened; True when the loop
    closed (drift flagged in time, policy applied by every rank, measured within budget)."""
    sc = scenario or DriftScenario()
    job = f"drift-gpt-{time.strftime('%H%M%S')}"
    workdir = Path("var") / job
    workdir.mkdir(parents=True, exist_ok=True)
    peaks = modelled_peaks(sc)
    budget = memory_budget(sc, peaks)
    console.print(
        f"dashboard  {vigil.base}/jobs/{job}\njob log    {workdir / 'job.log'}\n"
        f"job        {sc.ranks} ranks over gloo, sequence length {sc.short} → {sc.long} at "
        f"step {sc.change_at}, VIGIL_SWAP=1\nmemory     VIGIL_MEMORY_BUDGET_BYTES="
        f"{budget} ({human_bytes(budget)} per rank); one unmodified step needs "
        f"{human_bytes(peaks[sc.short]['peak'])} at {sc.short}, "
        f"{human_bytes(peaks[sc.long]['peak'])} at {sc.long} (modelled)"
    )
    admin = {"Authorization": f"Bearer {vigil.token('admin')}"}
    with (
        httpx.Client(base_url=f"{vigil.base}/api/v1", headers=admin, timeout=30) as api,
        (workdir / "job.log").open("wb") as log,
    ):
        proc = launch(
            base=vigil.base,
            token=vigil.token("ingest"),
            job=job,
            scenario=sc,
            budget=budget,
            log=log,
        )
        try:
            seen = _follow(console, api, job, sc, proc)
        finally:
            if proc.poll() is None:  # interrupted: leave no training process behind
                kill_tree(proc.pid)
                proc.wait()
    return _summarize(console, sc, seen, budget, peaks, proc.returncode)


def _follow(
    console: Console, api: httpx.Client, job: str, sc: DriftScenario, proc: subprocess.Popen[bytes]
) -> Seen:
    """Poll until the job exits (and a little after, for its last reports), printing a
    line for each new thing Vigil did."""
    said: set[str] = set()
    seen = Seen()
    settle = None
    while settle is None or time.monotonic() < settle:
        if settle is None and proc.poll() is not None:
            settle = time.monotonic() + 3
        try:
            seen = observe_drift(api, job)
        except httpx.HTTPError:
            time.sleep(0.5)
            continue
        for key, line in _lines(seen):
            if key not in said:
                said.add(key)
                console.print(f"{time.strftime('%H:%M:%S')}  {line}")
        time.sleep(0.5)
    console.print(f"job exited with code {proc.returncode}")
    return seen


def _lines(seen: Seen) -> list[tuple[str, str]]:
    """What there is to say about ``seen``, keyed so each is said once."""
    out = []
    for i in sorted(seen.incidents, key=lambda i: int(i["id"])):
        what = {"opseq_change": "drift detected", "memory_pressure": "memory pressure"}
        if i["kind"] in what:
            out.append(
                (
                    f"i{i['id']}",
                    f"[yellow]{what[i['kind']]}[/yellow]: incident #{i['id']} {i['kind']} "
                    f"since step {i['first_step']}: {i['summary']}",
                )
            )
    if seen.action is not None and seen.version is not None:
        a = seen.action
        out.append(
            (
                f"a{a['id']}",
                f"[cyan]policy v{seen.version} pushed[/cyan] (apply_swap_policy #{a['id']}, "
                f"{a['requested_by']}): offloads {seen.offloaded} of {seen.storages} saved "
                f"tensor storages; {a['reason']}",
            )
        )
    for rank, r in sorted(seen.results.items()):
        if r.get("applied"):
            out.append(
                (
                    f"r{rank}",
                    f"[green]rank {rank} applied v{r['version']} from step {r['from_step']}"
                    f"[/green] (measured peak {human_bytes(r['peak_bytes'] or 0)})",
                )
            )
    return out


def _summarize(
    console: Console,
    sc: DriftScenario,
    seen: Seen,
    budget: int,
    peaks: dict[int, dict[str, int]],
    returncode: int | None,
) -> bool:
    """The closing table and verdict; True when the loop closed."""
    policy = seen.policy or {}
    table = Table(title="memory per rank", show_lines=False)
    table.add_column("what")
    table.add_column("bytes", justify="right")
    table.add_column("")
    rows = [
        ("capacity (VIGIL_MEMORY_BUDGET_BYTES)", budget, ""),
        (f"unmodified step at {sc.short} (modelled)", peaks[sc.short]["peak"], "fits"),
        (f"unmodified step at {sc.long} (modelled)", peaks[sc.long]["peak"], "does not fit"),
        ("policy budget (capacity less its margin)", policy.get("budget_bytes"), ""),
        (f"v{seen.version} predicted peak", policy.get("predicted_peak_bytes"), ""),
        (f"v{seen.version} measured peak", policy.get("measured_peak_bytes"), ""),
    ]
    for what, value, note in rows:
        table.add_row(what, "—" if value is None else f"{human_bytes(value)} ({value:,})", note)
    console.print(table)
    problems = _problems(sc, seen)
    if problems:
        console.print("[red]the loop did not close:[/red] " + "; ".join(problems))
        return False
    assert seen.incident is not None
    first = min(r["from_step"] for r in seen.results.values())
    console.print(
        f"drift at step {sc.change_at} flagged from step {seen.incident['first_step']}; "
        f"policy v{seen.version} applied from step {first} on every rank; measured peak "
        f"{human_bytes(policy['measured_peak_bytes'])} within its "
        f"{human_bytes(policy['budget_bytes'])} budget"
        + ("" if returncode == 0 else f" (the job exited with code {returncode})")
    )
    return returncode == 0


def _problems(sc: DriftScenario, seen: Seen) -> list[str]:
    if seen.incident is None:
        return ["no opseq_change incident"]
    out = []
    if not sc.change_at <= seen.incident["first_step"] <= sc.change_at + DETECT_WITHIN:
        out.append(f"the incident starts at step {seen.incident['first_step']}")
    if seen.action is None or seen.version is None:
        return [*out, "no apply_swap_policy action"]
    if not seen.applied(sc.ranks):
        out.append(f"applied by ranks {sorted(seen.results)} of {sc.ranks}")
    policy = seen.policy or {}
    measured, limit = policy.get("measured_peak_bytes"), policy.get("budget_bytes")
    if measured is not None and limit is not None and measured > limit:
        out.append(f"measured peak {measured} over the {limit} budget")
    return out

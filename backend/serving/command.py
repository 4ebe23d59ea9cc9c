"""The ``vigil replay`` command's body: read the trace, replay it with a live progress bar,
ship the records, print the closing table. Returns the exit code.

    vigil replay examples/data/serving/mooncake_conversation_10min.jsonl \\
        --target http://127.0.0.1:8100 --job chat-replay --speedup 4 --limit 200
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from backend.serving.replay import (
    Api,
    PromptMode,
    Replay,
    ReplayError,
    ReplayOptions,
    finish_shipping,
    ship_to,
)
from backend.serving.report import summarize, summary_table
from backend.serving.traces import TraceError, read_trace


def run_replay_command(
    *,
    trace_path: Path,
    target: str,
    job: str,
    console: Console,
    err: Console,
    endpoint: str | None,
    token: str | None,
    speedup: float = 1.0,
    limit: int | None = None,
    trace_format: str = "auto",
    model: str | None = None,
    concurrency_cap: int = 512,
    api: Api = "completions",
    prompt_mode: PromptMode = "auto",
    timeout_s: float = 600.0,
    json_out: Path | None = None,
) -> int:
    try:
        trace = read_trace(trace_path, trace_format, limit)
    except (OSError, TraceError) as exc:
        err.print(f"[red]{exc}[/red]")
        return 2
    if not trace.requests:
        err.print(f"[red]{trace_path}: no requests[/red]")
        return 2
    if speedup <= 0:
        err.print("[red]--speedup must be positive[/red]")
        return 2
    options = ReplayOptions(
        target=target,
        speedup=speedup,
        concurrency_cap=concurrency_cap,
        model=model,
        api=api,
        prompt_mode=prompt_mode,
        timeout_s=timeout_s,
    )
    skipped = f", {trace.skipped} failed rows skipped" if trace.skipped else ""
    console.print(
        f"{trace_path.name}: {len(trace.requests)} {trace.format} requests over "
        f"{trace.duration_s:.0f} s{skipped}; replaying at {speedup:g}× "
        f"(about {trace.duration_s / speedup:.0f} s) to {target}"
    )
    shipping = False
    if endpoint:
        if _answers(endpoint):
            shipping = ship_to(endpoint, token, job)
            console.print(f"reporting what the client sees to {endpoint} as job {job!r}")
        else:
            err.print(
                f"[yellow]Vigil at {endpoint} does not answer: the requests are not reported "
                "(--no-ship says so up front)[/yellow]"
            )

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    task = progress.add_task("replay", total=len(trace.requests), status="")

    def update(run: Replay) -> None:
        done = len(run.outcomes)
        ok = sum(o.status == "ok" for o in run.outcomes)
        progress.update(
            task,
            completed=done,
            status=f"sent {run.sent} · in flight {run.in_flight} · ok {ok} · failed {done - ok}",
        )

    run: Replay | None = None
    interrupted = False
    try:
        run = Replay(trace.requests, options, on_update=update)
        with progress:
            asyncio.run(run.play())
    except ReplayError as exc:
        err.print(f"[red]{exc}[/red]")
        return 1
    except KeyboardInterrupt:
        interrupted = True
        err.print("[yellow]interrupted: the summary covers the requests sent so far[/yellow]")
    finally:
        if shipping:
            delivered = finish_shipping()
            if not delivered:
                err.print(f"[yellow]not every record reached {endpoint} in time[/yellow]")
    assert run is not None
    summary = summarize(run.outcomes)
    console.print(f"replay of {trace_path.name} ({run.api} API, prompts by {run.prompt_mode}):")
    console.print(summary_table(summary))
    for example in summary.errors:
        err.print(f"  e.g. {example}")
    if json_out is not None:
        json_out.write_text(json.dumps(summary.as_dict(), indent=2) + "\n")
    if interrupted:
        return 130
    return 0 if summary.ok else 1


def _answers(endpoint: str) -> bool:
    """Whether anything answers HTTP at ``endpoint`` (Vigil's ``/healthz``, leniently)."""
    try:
        httpx.get(endpoint.rstrip("/") + "/healthz", timeout=3)
    except httpx.HTTPError:
        return False
    return True

"""The ``vigil`` command.

vigil server                      # API (embedded: SQLite, migrates itself)
vigil migrate                     # upgrade the database to the latest schema
vigil worker / vigil beat         # distributed mode: Celery worker and scheduler
vigil relay --endpoint URL        # per-host relay: a node's ranks, one request per flush
vigil token create -s read -n ci  # prints a new token once
vigil jobs                        # jobs known to a running server
vigil incidents JOB / ack ID / resolve ID / act JOB KIND / silence add|list|expire  # on call
vigil import flight-recorder DIR --job NAME  # Flight Recorder dumps, diagnosed by the server
vigil import kineto FILE --job NAME          # PyTorch profiler traces, stored as telemetry
vigil demo --fast                 # embedded Vigil + a real faulty job, diagnosed and healed
vigil replay TRACE --target URL --job NAME   # serving trace replay, reported to Vigil
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

if TYPE_CHECKING:
    from backend.settings import Settings

try:
    import typer
    from rich.console import Console
    from rich.table import Table
except ImportError:  # the collector-only install has no server dependencies
    typer = None  # type: ignore[assignment]

if typer is None:

    def main() -> None:
        sys.stderr.write(
            "vigil: the command needs the server dependencies: pip install 'vigil[server]'\n"
        )
        raise SystemExit(2)

else:
    app = typer.Typer(
        help="Vigil: find stragglers, hangs and crashes in PyTorch jobs.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    token_app = typer.Typer(help="Create, list and revoke API tokens.", no_args_is_help=True)
    app.add_typer(token_app, name="token")
    import_app = typer.Typer(help="Import diagnostics recorded elsewhere.", no_args_is_help=True)
    app.add_typer(import_app, name="import")
    # Piped output (grep, tests) gets wide lines rather than truncated job names.
    console = Console(width=None if sys.stdout.isatty() else 200)
    err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)

    def _settings(**overrides: object):  # type: ignore[no-untyped-def]
        from backend.settings import SettingsError, load_settings

        try:
            return load_settings(**overrides)
        except SettingsError as exc:
            err.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None

    def _ensure_schema(url: str, migrate: bool) -> None:
        from sqlalchemy.exc import OperationalError

        from backend.db import make_engine
        from backend.migrate import current_revision, head_revision, upgrade

        if migrate:
            upgrade(url)
            return
        engine = make_engine(url)
        try:
            current = current_revision(engine)
        except OperationalError as exc:
            err.print(f"[red]cannot reach the database {engine.url!r}: {exc.orig}[/red]")
            raise typer.Exit(1) from None
        finally:
            engine.dispose()
        if current != head_revision():
            err.print(
                f"[red]database schema is at {current or 'nothing'}, this Vigil needs "
                f"{head_revision()}: run `vigil migrate` first[/red]"
            )
            raise typer.Exit(1)

    @app.command()
    def server(
        host: Annotated[str | None, typer.Option(help="Listen address [VIGIL_HOST]")] = None,
        port: Annotated[int | None, typer.Option(help="Listen port [VIGIL_PORT]")] = None,
        migrate: Annotated[
            bool | None,
            typer.Option(help="Upgrade the schema first (default: yes on SQLite, no otherwise)"),
        ] = None,
    ) -> None:
        """Run the API server (and, in embedded mode, everything else in-process)."""
        import uvicorn

        from backend.api import create_app

        settings = _settings()
        _ensure_schema(settings.database_url, settings.is_sqlite if migrate is None else migrate)
        mode = "embedded" if settings.embedded else "distributed"
        console.print(f"Vigil {mode} on http://{host or settings.host}:{port or settings.port}")
        uvicorn.run(
            create_app(settings),
            host=host or settings.host,
            port=port or settings.port,
            log_level=settings.log_level.lower(),
        )

    def _distributed_settings() -> Settings:
        settings: Settings = _settings()
        if settings.embedded:
            err.print(
                "[red]VIGIL_REDIS_URL is not set: workers and beat are for distributed mode "
                "(in embedded mode `vigil server` runs everything in-process)[/red]"
            )
            raise typer.Exit(2)
        return settings

    @app.command()
    def worker(
        concurrency: Annotated[int, typer.Option(help="Worker processes")] = 2,
        pool: Annotated[
            str, typer.Option(help="Celery pool: prefork, threads or solo")
        ] = "prefork",
    ) -> None:
        """Run a Celery worker: detection, sweeps, webhook delivery, action upkeep."""
        from backend.celery_app import QUEUE, celery, configure

        settings = _distributed_settings()
        _ensure_schema(settings.database_url, False)
        configure(settings)
        import backend.tasks  # noqa: F401  (registers every task)

        celery.worker_main(
            [
                "worker",
                f"--queues={QUEUE}",
                f"--concurrency={concurrency}",
                f"--pool={pool}",
                f"--loglevel={settings.log_level}",
                "--without-gossip",
                "--without-mingle",
            ]
        )

    @app.command()
    def beat() -> None:
        """Run Celery beat: the periodic sweeps. Run one per installation (periodic tasks
        also take a Redis lock, so a second beat by mistake does no double work)."""
        import tempfile

        from backend.celery_app import celery, configure

        settings = _distributed_settings()
        configure(settings)
        import backend.tasks  # noqa: F401

        schedule = Path(tempfile.gettempdir()) / f"vigil-beat-{os.getuid()}"
        celery.start(["beat", f"--loglevel={settings.log_level}", f"--schedule={schedule}"])

    @app.command(
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,
    )
    def relay(ctx: typer.Context) -> None:
        """Per-host relay: merges a node's ranks' batches into one request per flush to the
        server (`vigil relay --help` for its options; the same as `python -m collector.relay`)."""
        from collector.relay.cli import main as relay_main

        raise typer.Exit(relay_main(ctx.args))

    @app.command("migrate")
    def migrate_cmd() -> None:
        """Upgrade the database at VIGIL_DATABASE_URL to the latest schema."""
        from backend.migrate import head_revision, upgrade

        settings = _settings()
        upgrade(settings.database_url)
        console.print(f"database at revision {head_revision()}")

    @token_app.command("create")
    def token_create(
        scope: Annotated[
            list[str], typer.Option("--scope", "-s", help="ingest, read or admin; repeatable")
        ],
        name: Annotated[str, typer.Option("--name", "-n", help="Who or what uses it")] = "token",
    ) -> None:
        """Create a token. It is printed once; only its hash is stored."""
        from backend.auth.service import create_token
        from backend.db import make_engine, make_sessionmaker, session_scope

        settings = _settings()
        engine = make_engine(settings.database_url)
        try:
            with session_scope(make_sessionmaker(engine)) as session:
                row, secret = create_token(session=session, name=name, scopes=scope)
                scopes, token_id = row.scopes, row.id
        except ValueError as exc:
            err.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
        finally:
            engine.dispose()
        err.print(
            f"token {token_id} ({name}, scopes: {scopes}); store it now, it is not shown again:"
        )
        print(secret)

    @token_app.command("list")
    def token_list() -> None:
        """List tokens (never their secrets)."""
        from backend.auth.service import list_tokens
        from backend.db import make_engine, make_sessionmaker, session_scope

        engine = make_engine(_settings().database_url)
        table = Table("id", "name", "prefix", "scopes", "created", "last used", "revoked")
        with session_scope(make_sessionmaker(engine)) as session:
            for t in list_tokens(session=session):
                table.add_row(
                    str(t.id),
                    t.name,
                    t.prefix + "…",
                    t.scopes,
                    f"{t.created_at:%Y-%m-%d %H:%M}",
                    f"{t.last_used_at:%Y-%m-%d %H:%M}" if t.last_used_at else "—",
                    f"{t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "",
                )
        engine.dispose()
        console.print(table)

    @token_app.command("revoke")
    def token_revoke(token_id: int) -> None:
        """Revoke a token by id; servers stop accepting it within VIGIL_TOKEN_CACHE_S."""
        from backend.auth.service import revoke_token
        from backend.db import make_engine, make_sessionmaker, session_scope

        engine = make_engine(_settings().database_url)
        with session_scope(make_sessionmaker(engine)) as session:
            found = revoke_token(session=session, token_id=token_id) is not None
        engine.dispose()
        if not found:
            err.print(f"[red]no token with id {token_id}[/red]")
            raise typer.Exit(1)
        console.print(f"token {token_id} revoked")

    def _endpoint_and_token(
        endpoint: str | None, token: str | None, scope: str = "read"
    ) -> tuple[str, str]:
        settings = _settings()
        endpoint = (
            endpoint
            or os.environ.get("VIGIL_ENDPOINT")
            or f"http://{settings.host}:{settings.port}"
        )
        token = token or os.environ.get("VIGIL_TOKEN")
        if not token:
            usable = [t for t, scopes in settings.bootstrap_tokens().items() if scope in scopes]
            token = usable[0] if usable else ""
        return endpoint.rstrip("/"), token

    @app.command()
    def jobs(
        endpoint: Annotated[str | None, typer.Option(help="Server URL [VIGIL_ENDPOINT]")] = None,
        token: Annotated[str | None, typer.Option(help="Read token [VIGIL_TOKEN]")] = None,
    ) -> None:
        """List the jobs a running server knows."""
        import httpx

        url, bearer = _endpoint_and_token(endpoint, token)
        try:
            reply = httpx.get(
                f"{url}/api/v1/jobs", headers={"Authorization": f"Bearer {bearer}"}, timeout=10
            )
        except httpx.HTTPError as exc:
            err.print(f"[red]cannot reach {url}: {exc}[/red]")
            raise typer.Exit(1) from None
        if reply.status_code != 200:
            err.print(f"[red]{url} answered {reply.status_code}: {reply.text}[/red]")
            raise typer.Exit(1)
        table = Table("job", "kind", "run", "world", "reporting", "last step", "last seen")
        for j in reply.json():
            run = j.get("run")
            table.add_row(
                j["name"],
                j["kind"],
                f"#{run['number']} {run['state']}" if run else "—",
                str(j["world_size"]),
                str(j["ranks_reporting"]),
                "—" if j["last_step"] is None else str(j["last_step"]),
                (j["last_seen_at"] or "—")[:19],
            )
        console.print(table)

    # vigil incidents / ack / resolve / act / silence: on call, over REST
    from backend.cli_oncall import register as register_oncall

    register_oncall(app, console=console, err=err, endpoint_and_token=_endpoint_and_token)

    @app.command()
    def demo(
        fast: Annotated[
            bool, typer.Option(help="A shorter job (under 3 minutes), then exit")
        ] = False,
        replay: Annotated[
            bool, typer.Option(help="Replay a real recorded job (PAI job_1) instead")
        ] = False,
        serving: Annotated[
            bool,
            typer.Option(help="A serving fleet with a slow replica instead (about 5 minutes)"),
        ] = False,
        swap: Annotated[
            bool,
            typer.Option(
                help="Only the job whose op sequence drifts, and the activation-swap policy "
                "Vigil pushes for it (about a minute)"
            ),
        ] = False,
        port: Annotated[int, typer.Option(help="Port for the demo server")] = 8000,
        database: Annotated[
            str, typer.Option(help="Database for the demo")
        ] = "sqlite:///./var/demo.db",
    ) -> None:
        """Start Vigil embedded and run a real 4-rank training job with injected faults
        (a straggler, a NaN, a hang) that Vigil diagnoses and heals; exit code 0 when every
        fault was flagged with the right ranks and the job finished."""
        from backend.demo import run_replay, run_story

        if serving:
            from backend.demo.serving_story import run_serving_story

            raise typer.Exit(run_serving_story(console=console, port=port, database_url=database))
        if swap:
            from backend.demo.swap_story import run_swap_story

            play = run_swap_story
        else:
            play = run_replay if replay else run_story
        raise typer.Exit(play(console=console, port=port, database_url=database, fast=fast))

    @app.command(context_settings={"allow_interspersed_args": False})
    def run(
        command: Annotated[list[str], typer.Argument(help="The command, after --")],
        job: Annotated[str | None, typer.Option(help="Job name [VIGIL_JOB]")] = None,
        endpoint: Annotated[str | None, typer.Option(help="Server URL [VIGIL_ENDPOINT]")] = None,
        token: Annotated[str | None, typer.Option(help="Ingest token [VIGIL_TOKEN]")] = None,
        chaos: Annotated[
            str | None, typer.Option(help="Faults to inject, see collector/chaos.py")
        ] = None,
    ) -> None:
        """Run a command (typically torchrun …) with the collector set up in every rank.

        vigil run --job llama -- torchrun --nproc-per-node 8 train.py
        """
        from backend.launch import launch

        url, bearer = _endpoint_and_token(endpoint, token, scope="ingest")
        raise typer.Exit(launch(command, endpoint=url, token=bearer, job=job, chaos=chaos))

    @app.command()
    def replay(
        trace: Annotated[
            Path, typer.Argument(help="Serving trace: Azure 2023 CSV, Mooncake JSONL, BurstGPT")
        ],
        target: Annotated[
            str, typer.Option(help="OpenAI-compatible server, e.g. http://127.0.0.1:8100")
        ],
        job: Annotated[str, typer.Option(help="Job to report the requests under")],
        speedup: Annotated[float, typer.Option(help="Send K times faster than recorded")] = 1.0,
        limit: Annotated[int | None, typer.Option(help="Only the first N requests")] = None,
        trace_format: Annotated[
            str, typer.Option("--format", help="auto, azure, mooncake or burstgpt")
        ] = "auto",
        model: Annotated[
            str | None, typer.Option(help="Model name to ask for (default: the target's first)")
        ] = None,
        concurrency_cap: Annotated[int, typer.Option(help="Most requests in flight")] = 512,
        api: Annotated[str, typer.Option(help="completions or chat")] = "completions",
        prompt_mode: Annotated[
            str,
            typer.Option(help="auto, count (Vigil's example server) or words (any server)"),
        ] = "auto",
        timeout: Annotated[float, typer.Option(help="Seconds one request may take")] = 600.0,
        ship: Annotated[bool, typer.Option(help="Report the requests to Vigil")] = True,
        endpoint: Annotated[str | None, typer.Option(help="Vigil URL [VIGIL_ENDPOINT]")] = None,
        token: Annotated[str | None, typer.Option(help="Ingest token [VIGIL_TOKEN]")] = None,
        json_out: Annotated[
            Path | None, typer.Option("--json", help="Also write the summary here")
        ] = None,
    ) -> None:
        """Replay a serving trace against an OpenAI-compatible server at its real arrival
        times (streamed, exact output lengths), and report to Vigil what the client saw:
        TTFT and every token's arrival.

        vigil replay conversation_trace.jsonl --target http://127.0.0.1:8100 --job chat
        """
        from backend.serving.command import run_replay_command

        if api not in ("completions", "chat") or prompt_mode not in ("auto", "count", "words"):
            err.print("[red]--api is completions or chat; --prompt-mode auto, count or words[/]")
            raise typer.Exit(2)
        url, bearer = _endpoint_and_token(endpoint, token, scope="ingest") if ship else ("", "")
        raise typer.Exit(
            run_replay_command(
                trace_path=trace,
                target=target,
                job=job,
                console=console,
                err=err,
                endpoint=url or None,
                token=bearer or None,
                speedup=speedup,
                limit=limit,
                trace_format=trace_format,
                model=model,
                concurrency_cap=concurrency_cap,
                api=api,  # type: ignore[arg-type]
                prompt_mode=prompt_mode,  # type: ignore[arg-type]
                timeout_s=timeout,
                json_out=json_out,
            )
        )

    @import_app.command("flight-recorder")
    def import_flight_recorder(
        directory: Annotated[Path, typer.Argument(help="Folder with one dump per rank")],
        job: Annotated[str, typer.Option("--job", help="Job to file the incident under")],
        endpoint: Annotated[str | None, typer.Option(help="Server URL [VIGIL_ENDPOINT]")] = None,
        token: Annotated[
            str | None, typer.Option(help="Token with the 'ingest' scope [VIGIL_TOKEN]")
        ] = None,
        local: Annotated[
            bool,
            typer.Option(
                "--local",
                help="Write VIGIL_DATABASE_URL directly instead of a server (SQLite is "
                "migrated first; other databases need `vigil migrate`)",
            ),
        ] = False,
    ) -> None:
        """Name the ranks a hung job waits for, from PyTorch Flight Recorder dumps; the
        diagnosis is stored on the server as the job's hang incident."""
        from backend.importers import command

        if local:
            settings = _settings()
            _ensure_schema(settings.database_url, migrate=settings.is_sqlite)
            code = command.locally(
                directory=directory, job=job, settings=settings, console=console, err=err
            )
        else:
            url, bearer = _endpoint_and_token(endpoint, token, scope="ingest")
            code = command.over_rest(
                directory=directory, job=job, endpoint=url, token=bearer, console=console, err=err
            )
        raise typer.Exit(code)

    @import_app.command("kineto")
    def import_kineto(
        paths: Annotated[
            list[Path], typer.Argument(help="Trace files (.json, .json.gz) or folders of them")
        ],
        job: Annotated[str, typer.Option("--job", help="Job to store the iterations under")],
        rank: Annotated[
            int | None,
            typer.Option(help="The rank of a single file (default: its distributedInfo)"),
        ] = None,
        endpoint: Annotated[str | None, typer.Option(help="Server URL [VIGIL_ENDPOINT]")] = None,
        token: Annotated[
            str | None, typer.Option(help="Token with the 'ingest' scope [VIGIL_TOKEN]")
        ] = None,
        local: Annotated[
            bool, typer.Option("--local", help="Write VIGIL_DATABASE_URL instead of a server")
        ] = False,
    ) -> None:
        """Store PyTorch profiler (Kineto) traces as a job's steps, collectives and op
        sequences, with each iteration's GPU breakdown; one file per rank."""
        from backend.importers import kineto_command as command

        if local:
            settings = _settings()
            _ensure_schema(settings.database_url, migrate=settings.is_sqlite)
            code = command.locally(
                paths=paths, job=job, rank=rank, settings=settings, console=console, err=err
            )
        else:
            url, bearer = _endpoint_and_token(endpoint, token, scope="ingest")
            code = command.over_rest(
                paths=paths,
                job=job,
                rank=rank,
                endpoint=url,
                token=bearer,
                console=console,
                err=err,
            )
        raise typer.Exit(code)

    def main() -> None:
        app()

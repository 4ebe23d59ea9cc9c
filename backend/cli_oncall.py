"""On-call commands of ``vigil``, over a running server's REST API.

    vigil incidents llama --status open           # the job's incidents, as a table
    vigil incidents llama --run 2                 # those opened in its second launch
    vigil ack 42 --note "draining node 7"         # someone is on it: reminders stop
    vigil resolve 42 --note "node 7 replaced"     # closed by hand, receivers told
    vigil silence add --job 'llama-*' --kind straggler --for 2h --note "node 7 drained"
    vigil silence list --state active
    vigil silence expire 3
    vigil act llama dump_stacks --ranks 2,5 --incident 42

Each command is one REST call (``--endpoint`` / ``VIGIL_ENDPOINT``, ``--token`` /
``VIGIL_TOKEN``, as ``vigil jobs``): reading needs a ``read`` token, changing anything an
``admin`` one. A failure is one line on stderr, never a traceback, and an exit status:
``1`` the server could not be reached or refused (401/403 token, 404, 409 state, e.g.
``run_not_live`` when no rank of the job is left to act), ``2`` bad input (a malformed
option here, or a ``422`` naming the field). ``backend.cli`` registers them
(:func:`register`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import quote

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

TIMEOUT_S = 10.0
EndpointAndToken = Callable[[str | None, str | None, str], tuple[str, str]]
Endpoint = Annotated[str | None, typer.Option(help="Server URL [VIGIL_ENDPOINT]")]
Token = Annotated[str | None, typer.Option(help="Token [VIGIL_TOKEN]")]
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


class Failed(Exception):
    """One line for stderr, and the exit status."""

    def __init__(self, line: str, code: int = 1) -> None:
        super().__init__(line)
        self.code = code


def parse_duration(text: str) -> int:
    """``"2h"`` → 7200, ``"1h30m"`` → 5400, ``"45m"``, ``"1d"``, ``"90s"``; whole seconds."""
    compact = text.replace(" ", "").lower()
    parts = _DURATION.findall(compact)
    if not parts or "".join(n + u for n, u in parts) != compact:
        raise Failed(f"--for {text!r}: a duration like 30m, 2h, 1h30m or 1d", 2)
    return round(sum(float(n) * _UNIT_S[u] for n, u in parts))


def parse_ranks(text: str | None) -> list[int] | None:
    """``"2,5"`` → ``[2, 5]``; ``None`` stays ``None`` (every rank)."""
    if text is None:
        return None
    try:
        ranks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        ranks = []
    if not ranks or any(r < 0 for r in ranks):
        raise Failed(f"--ranks {text!r}: rank numbers separated by commas, e.g. 2,5", 2)
    return sorted(set(ranks))


def _explain(url: str, reply: httpx.Response, scope: str) -> Failed:
    """A refusal as one line: the error code, the status and the server's message."""
    try:
        body = reply.json()
    except ValueError:
        body = {}
    detail: Any = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list):  # invalid fields: name them
        detail = "; ".join(f"{d.get('field')}: {d.get('msg')}" for d in detail[:3])
    text = " ".join(str(detail or reply.text[:300] or reply.reason_phrase).split())
    error = body.get("error") if isinstance(body, dict) else None
    head = f"{url} refused: {error or reply.reason_phrase} ({reply.status_code})"
    if reply.status_code == 401:
        text += f"; pass --token or set VIGIL_TOKEN (a token with the {scope!r} scope)"
    elif reply.status_code == 403:
        text += f"; this needs a token with the {scope!r} scope"
    return Failed(f"{head}: {text}", 2 if reply.status_code == 422 else 1)


class Api:
    """The server and the token the command was given."""

    def __init__(self, url: str, token: str, scope: str) -> None:
        self.url, self.token, self.scope = url, token, scope

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            reply = httpx.request(
                method,
                f"{self.url}/api/v1{path}",
                headers={"Authorization": f"Bearer {self.token}"},
                timeout=TIMEOUT_S,
                **kwargs,
            )
        except httpx.HTTPError as exc:
            raise Failed(
                f"cannot reach {self.url} ({exc}): start `vigil server` or pass "
                "--endpoint URL [VIGIL_ENDPOINT]"
            ) from None
        if reply.status_code >= 400:
            raise _explain(self.url, reply, self.scope)
        return reply.json() if reply.content else None


def _job(name: str) -> str:
    return quote(name, safe="")


def _ranks_text(ranks: list[int] | None) -> str:
    return "every rank" if ranks is None else ", ".join(map(str, ranks)) or "—"


def _handled(i: dict[str, Any]) -> str:
    if i["status"] != "open":
        by = i.get("resolved_by")
        return f"resolved by {by}: {i.get('resolution_note') or ''}".strip() if by else "resolved"
    notes = [f"acked by {i['acked_by']}"] if i.get("acked_by") else []
    notes += [f"silenced (#{', #'.join(map(str, i['silenced_by']))})"] if i["silenced_by"] else []
    return "; ".join(notes) or "—"


def register(
    app: typer.Typer, *, console: Console, err: Console, endpoint_and_token: EndpointAndToken
) -> None:
    """Add ``incidents``, ``ack``, ``resolve``, ``act`` and ``silence …`` to ``app``."""

    def run(
        scope: str, endpoint: str | None, token: str | None, body: Callable[[Api], None]
    ) -> None:
        url, bearer = endpoint_and_token(endpoint, token, scope)
        try:
            body(Api(url, bearer, scope))
        except Failed as failure:
            err.print(f"[red]vigil: {escape(str(failure))}[/red]", soft_wrap=True)
            raise typer.Exit(failure.code) from None

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    @app.command()
    def incidents(
        job: Annotated[str, typer.Argument(help="The job's name")],
        status: Annotated[str | None, typer.Option(help="open or resolved (default: both)")] = None,
        run_number: Annotated[
            int | None, typer.Option("--run", help="Only those of this run (its number)")
        ] = None,
        limit: Annotated[int, typer.Option(help="At most this many, newest first")] = 50,
        endpoint: Endpoint = None,
        token: Token = None,
    ) -> None:
        """List a job's incidents, newest first: how long open, who handles them."""

        def body(api: Api) -> None:
            if status not in (None, "open", "resolved"):
                raise Failed(f"--status {status!r}: open or resolved", 2)
            params = {"status": status, "run": run_number, "limit": limit}
            rows = api.call(
                "GET",
                f"/jobs/{_job(job)}/incidents",
                params={k: v for k, v in params.items() if v is not None},
            )
            if not rows:
                say(f"no incidents of job {job!r} match")
                return
            from backend.incidents.handling import duration_text

            columns = ("id", "run", "kind", "severity", "status", "ranks", "since step")
            table = Table(*columns, "open for", "handled", "summary")
            for i in rows:
                table.add_row(
                    str(i["id"]),
                    f"#{i.get('run', 1)}",
                    i["kind"],
                    i["severity"],
                    i["status"],
                    ", ".join(map(str, i["ranks"])) or "—",
                    "—" if i["first_step"] is None else str(i["first_step"]),
                    duration_text(i["open_for_s"]),
                    escape(_handled(i)),
                    escape(i["summary"]),
                )
            console.print(table)

        run("read", endpoint, token, body)

    @app.command()
    def ack(
        incident_id: Annotated[int, typer.Argument(help="The incident's id")],
        note: Annotated[str, typer.Option(help="What you are doing (audited)")] = "",
        endpoint: Endpoint = None,
        token: Token = None,
    ) -> None:
        """Acknowledge an open incident: you are on it, reminders stop."""

        def body(api: Api) -> None:
            out = api.call("POST", f"/incidents/{incident_id}/ack", json={"note": note})
            what = f"incident {incident_id} ({out['kind']}, job {out['job']})"
            say(f"{what} acknowledged by {out['acked_by']}")

        run("admin", endpoint, token, body)

    @app.command()
    def resolve(
        incident_id: Annotated[int, typer.Argument(help="The incident's id")],
        note: Annotated[str, typer.Option(help="Why it is resolved (required)")],
        endpoint: Endpoint = None,
        token: Token = None,
    ) -> None:
        """Resolve an open incident by hand: receivers hear it, its proposals are cancelled,
        detection does not re-open the same episode."""

        def body(api: Api) -> None:
            out = api.call("POST", f"/incidents/{incident_id}/resolve", json={"note": note})
            what = f"incident {incident_id} ({out['kind']}, job {out['job']})"
            say(f"{what} resolved by {out['resolved_by']}: {out['resolution_note']}")

        run("admin", endpoint, token, body)

    @app.command()
    def act(
        job: Annotated[str, typer.Argument(help="The job's name")],
        kind: Annotated[str, typer.Argument(help="dump_stacks, checkpoint_now, restart, …")],
        ranks: Annotated[
            str | None, typer.Option(help="Only these ranks, e.g. 2,5 (default: every rank)")
        ] = None,
        incident: Annotated[
            int | None, typer.Option(help="The incident it answers (its id)")
        ] = None,
        reason: Annotated[str, typer.Option(help="Why (shown with the action)")] = "",
        endpoint: Endpoint = None,
        token: Token = None,
    ) -> None:
        """Trigger a recovery action on a job's live ranks (they get it in their next
        reply); refused when the job's run has ended or no rank reports."""

        def body(api: Api) -> None:
            request: dict[str, Any] = {
                "kind": kind,
                "target_ranks": parse_ranks(ranks),
                "reason": reason,
            }
            if incident is not None:
                request["incident_id"] = incident
            out = api.call("POST", f"/jobs/{_job(job)}/actions", json=request)
            answers = f", for incident {incident}" if incident is not None else ""
            whom = f"{_ranks_text(out['target_ranks'])} of job {job!r}{answers}"
            say(f"action {out['id']} {out['kind']} {out['state']} for {whom}")

        run("admin", endpoint, token, body)

    silence_app = typer.Typer(help="Mute notifications for a while.", no_args_is_help=True)
    app.add_typer(silence_app, name="silence")

    @silence_app.command("add")
    def silence_add(
        for_: Annotated[str, typer.Option("--for", help="How long: 30m, 2h, 1h30m, 1d")],
        note: Annotated[str, typer.Option(help="Why (shown on the silenced incidents)")],
        job: Annotated[str | None, typer.Option(help="Job name, or a glob: 'llama-*'")] = None,
        kind: Annotated[str | None, typer.Option(help="Incident kind")] = None,
        severity: Annotated[str | None, typer.Option(help="info, warning or critical")] = None,
        ranks: Annotated[
            str | None,
            typer.Option(help="Incidents naming these ranks, e.g. 2,5 (one silence per rank)"),
        ] = None,
        endpoint: Endpoint = None,
        token: Token = None,
    ) -> None:
        """Silence the incidents every given matcher matches: they still open and show,
        but no receiver is notified until the silence ends."""

        def body(api: Api) -> None:
            seconds = parse_duration(for_)
            matchers = {"job": job, "kind": kind, "severity": severity}
            given = {k: v for k, v in matchers.items() if v is not None}
            picked = parse_ranks(ranks)
            if not given and picked is None:
                raise Failed("give at least one of --job, --kind, --severity, --ranks", 2)
            for rank in picked if picked is not None else [None]:
                one = given if rank is None else {**given, "rank": rank}
                request = {"matchers": one, "duration_s": seconds, "comment": note}
                out = api.call("POST", "/silences", json=request)
                what = f"silence {out['id']} ({_matchers(out['matchers'])})"
                say(f"{what} {out['state']} until {out['ends_at'][:19]} UTC")

        run("admin", endpoint, token, body)

    @silence_app.command("list")
    def silence_list(
        state: Annotated[
            str | None, typer.Option(help="pending, active or expired (default: all)")
        ] = None,
        endpoint: Endpoint = None,
        token: Token = None,
    ) -> None:
        """List silences, newest first."""

        def body(api: Api) -> None:
            if state not in (None, "pending", "active", "expired"):
                raise Failed(f"--state {state!r}: pending, active or expired", 2)
            rows = api.call("GET", "/silences", params={"state": state} if state else {})
            if not rows:
                say("no silences" + (f" {state}" if state else ""))
                return
            table = Table("id", "state", "matchers", "from", "until", "by", "note")
            for s in rows:
                table.add_row(
                    str(s["id"]),
                    s["state"],
                    escape(_matchers(s["matchers"])),
                    s["starts_at"][:19],
                    s["ends_at"][:19],
                    escape(f"expired by {s['expired_by']}" if s["expired_by"] else s["created_by"]),
                    escape(s["comment"]),
                )
            console.print(table)

        run("read", endpoint, token, body)

    @silence_app.command("expire")
    def silence_expire(
        silence_id: Annotated[int, typer.Argument(help="The silence's id")],
        endpoint: Endpoint = None,
        token: Token = None,
    ) -> None:
        """End a silence now (it is kept, as expired)."""

        def body(api: Api) -> None:
            out = api.call("DELETE", f"/silences/{silence_id}")
            say(f"silence {silence_id} ({_matchers(out['matchers'])}) expired")

        run("admin", endpoint, token, body)


def _matchers(matchers: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in matchers.items())

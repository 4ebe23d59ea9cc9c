"""``vigil demo --serving``: a serving fleet with one slow replica, diagnosed while you watch.

Vigil starts embedded; three replicas of the example model server start instrumented
(job ``<name>-server``), ``r2`` slowed 3x by ``--chaos slow:factor=3``; the Azure LLM
inference trace is replayed against them round-robin. Vigil names the slow replica
(``slow_replica``) and pages on the SLO burn (``slo_burn``), each sent to a local webhook
receiver; the slow replica is then stopped and the burn clears. The scenario is
:mod:`backend.demo.serving_fleet` (which the end-to-end test runs too); about five minutes.
The exit code is 0 when every fault was flagged, the right replica named and the
webhook told.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import threading
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from backend.demo.server import DemoServer, DemoServerError, embedded_server
from backend.demo.serving_fleet import (
    Fleet,
    LoadResult,
    Seen,
    ServingScenario,
    Thresholds,
    calibrate,
    configure,
    incidents,
    run_load,
)
from backend.serving.replay import finish_shipping, ship_to


class WebhookSink:
    """A local receiver for the demo's generic-format webhook: keeps each JSON body."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        lock = threading.Lock()
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with lock:
                    sink.bodies.append(json.loads(body or b"{}"))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def delivered(self, incident_id: int, event: str = "incident.firing") -> bool:
        return any(
            b.get("type") == event and b.get("data", {}).get("id") == incident_id
            for b in list(self.bodies)
        )

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def run_serving_story(*, console: Console, port: int, database_url: str) -> int:
    logging.getLogger("backend").setLevel(logging.ERROR)  # the story is told below
    scenario = ServingScenario(job=f"chat-{time.strftime('%H%M%S')}")
    sink = WebhookSink()
    try:
        with embedded_server(
            database_url=database_url, port=port, detect_interval_s=1.0, sweep_interval_s=1.0
        ) as vigil:
            console.print(
                f"[bold]Vigil demo: serving[/bold] · embedded, database {database_url}\n"
                f"dashboard  {vigil.base}/jobs/{scenario.server_job}/serving\n"
                f"fleet      {', '.join(scenario.replicas)} (model server); "
                f"{scenario.slow} --chaos slow:factor={scenario.slow_factor:g}\n"
                f"load       {scenario.trace.name}, {scenario.rate_rps:g} req/s round-robin"
            )
            return 0 if _play(console, vigil, scenario, sink) else 1
    except (DemoServerError, RuntimeError) as exc:
        console.print(f"[red]{exc}[/red]")
        return 1
    finally:
        sink.close()


def _play(console: Console, vigil: DemoServer, sc: ServingScenario, sink: WebhookSink) -> bool:
    def say(line: str) -> None:
        console.print(f"{time.strftime('%H:%M:%S')}  {line}")

    ingest, admin = vigil.token("ingest"), vigil.token("admin")
    with Fleet(sc, endpoint=vigil.base, token=ingest) as fleet:
        th = calibrate(fleet.urls[sc.replicas[0]])
        say(
            f"SLO 'interactive': TTFT ≤ {th.ttft_s * 1000:.0f} ms, TPOT ≤ {th.tpot_s * 1000:.1f} ms"
            f" (calibrated on {sc.replicas[0]}), objective {sc.objective:g}, period "
            f"{sc.period_s / 3600:g} h"
        )
        configure(vigil.base, admin, sc, th, webhook_url=sink.url)
        ship_to(vigil.base, ingest, sc.client_job)
        say("replaying; Vigil needs about three minutes of traffic to call a replica slow")

        def on_incident(seen: Seen, what: str) -> None:
            colour = "green" if what == "resolved" else "yellow"
            say(f"[{colour}]incident #{seen.id} {seen.kind} {what}[/{colour}]: {seen.summary}")

        try:
            result = asyncio.run(
                run_load(
                    fleet,
                    vigil.base,
                    admin,
                    on_incident=on_incident,
                    on_stop=lambda name, after: say(
                        f"{name} stopped after {after:.0f} s; the load goes on to the others"
                    ),
                )
            )
        finally:
            finish_shipping()
    time.sleep(3)  # the last webhook deliveries
    latest = {i["id"]: i for i in incidents(vigil.base, admin, sc.server_job)}
    table, ok = _table(sc, th, result, latest, sink)
    console.print(table)
    console.print(
        "every fault flagged, the slow replica named and the webhook told."
        if ok
        else "[red]a fault was missed or misnamed (see the table)[/red]"
    )
    return ok


def _table(
    sc: ServingScenario,
    th: Thresholds,
    result: LoadResult,
    latest: dict[int, dict[str, Any]],
    sink: WebhookSink,
) -> tuple[Table, bool]:
    table = Table(show_header=True, box=None)
    for col in ("fault", "started", "flagged", "replica named", "webhook", "resolved"):
        table.add_column(col)
    started = time.strftime("%H:%M:%S", time.localtime(result.started_at))
    ok = True
    rows = (
        ("slow_replica", f"slow replica: {sc.slow} at {sc.slow_factor:g}x"),
        ("slo_burn", f"SLO burn: TPOT > {th.tpot_s * 1000:.1f} ms"),
    )
    for kind, what in rows:
        seen = result.first(kind)
        paged = [s for s in result.incidents.values() if s.kind == kind and s.paged]
        if paged:  # the burn row shows the first page (a ticket may have come first)
            seen = min(paged, key=lambda s: s.detected_at)
        if seen is None:
            table.add_row(what, started, "[red]not flagged[/red]", "—", "—", "—")
            ok = False
            continue
        inc = latest.get(seen.id, {})
        lag = seen.detected_at - result.started_at
        at = time.strftime("%H:%M:%S", time.localtime(seen.detected_at))
        flagged = f"{at} (+{lag:.0f} s) #{seen.id}"
        if kind == "slow_replica":
            right = sc.slow in seen.summary and not any(
                r in seen.summary for r in sc.replicas if r != sc.slow
            )
            named = f"{sc.slow} ✓" if right else "✗"
        else:
            right, named = True, "—"
        told = sink.delivered(seen.id)
        if kind == "slo_burn":
            paging = any(t["firing"] for t in result.burn_after if t["severity"] == "critical")
            still_open = [
                i for i in latest.values() if i["kind"] == kind and i["status"] != "resolved"
            ]
            resolved = "no" if paging else "yes" if not still_open else "paging stopped"
        elif inc.get("status") == "resolved":
            resolved = "yes"
        else:
            resolved = f"not yet ({sc.slow} stopped)"
        ok = ok and right and told
        table.add_row(what, started, flagged, named, "firing ✓" if told else "✗", resolved)
    return table, ok

"""A faulty serving fleet under replayed load, watched by Vigil: the scenario that
``vigil demo --serving`` shows and ``tests/backend/serving/test_end_to_end.py`` checks.

    with Fleet(scenario, endpoint=base, token=ingest) as fleet:       # 3 model servers
        thresholds = calibrate(fleet.urls[0])                         # a healthy replica
        hook = configure(base, admin, scenario, thresholds, webhook_url=sink.url)
        result = asyncio.run(run_load(fleet, base, read, scenario))   # replay, stop r2, …

Three replicas of the example model server (``examples/serving/model_server.py``), each
instrumented with Vigil's ASGI middleware (job ``<job>-server``), one of them slowed by
``--chaos slow:factor=3``. A slice of the Azure LLM inference trace is replayed against them
round-robin by ``vigil replay``'s client (:class:`backend.serving.replay.Replay`), which
reports what it saw as job ``<job>-client``. Phase 1 runs until Vigil has flagged the slow
replica (``slow_replica``) and the SLO burn (``slo_burn``); then the slow replica is stopped
and phase 2 sends the load to the healthy two until both incidents have resolved.

Minutes are wall-clock minutes: ``slow_replica`` needs 3 of 5 counted replica-minutes slow
(≥ 5 requests each), so phase 1 takes about three minutes. With ``period_s`` 3600 every burn
window is one minute (:func:`detectors.burn_rate.windows_for`), so the burn stops within a
minute or two of the slow replica leaving; ``slow_replica`` resolves once the replica has
served nothing for two minutes its peers served.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from backend.launch import kill_tree
from backend.serving.replay import Outcome, Replay, ReplayOptions
from backend.serving.traces import TraceRequest, read_trace

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "examples" / "data" / "serving" / "AzureLLMInferenceTrace_conv_first10min.csv"


@dataclass(frozen=True)
class ServingScenario:
    job: str = "chat"
    replicas: tuple[str, ...] = ("r0", "r1", "r2")
    slow: str = "r2"
    slow_factor: float = 3.0
    # Each engine step padded to 10 ms, like a small model's decode step on an accelerator:
    # the tiny CPU model's own ~1 ms steps would drown in a busy host's scheduling noise.
    step_floor_s: float = 0.01
    rate_rps: float = 1.5  # requests a second over the fleet (≥ 5 per replica-minute)
    objective: float = 0.99  # a page tier (14.4x) can fire with one replica in three bad
    period_s: float = 3600.0  # every burn window one minute
    phase1_max_s: float = 240.0
    phase2_max_s: float = 210.0
    trace: Path = TRACE

    @property
    def server_job(self) -> str:
        return f"{self.job}-server"

    @property
    def client_job(self) -> str:
        return f"{self.job}-client"


@dataclass(frozen=True)
class Thresholds:
    ttft_s: float
    tpot_s: float

    def met(self, o: Outcome) -> bool:
        """The SLO's rule (``detectors/serving.py``), on what the client measured."""
        if o.status != "ok" or o.ttft_s is None or o.ttft_s > self.ttft_s:
            return False
        return o.tpot_s is None or o.tpot_s <= self.tpot_s


@dataclass
class Fleet:
    """The model-server replicas as subprocesses on free ports (a context manager)."""

    scenario: ServingScenario
    endpoint: str
    token: str
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)
    started_at: float = 0.0  # when every replica answered (the slow one is slow from the start)
    stopped: dict[str, float] = field(default_factory=dict)

    def __enter__(self) -> Fleet:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
        env.update(
            VIGIL_ENDPOINT=self.endpoint,
            VIGIL_TOKEN=self.token,
            VIGIL_LOG_LEVEL="WARNING",
            PYTHONPATH=str(ROOT),
        )
        try:
            for name in self.scenario.replicas:
                port = _free_port()
                args = ["--port", str(port), "--replica", name, "--job", self.scenario.server_job]
                args += ["--step-floor-s", f"{self.scenario.step_floor_s:g}"]
                if name == self.scenario.slow:
                    args += ["--chaos", f"slow:factor={self.scenario.slow_factor:g}"]
                self.procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "examples.serving.model_server", *args],
                    env={**env, "VIGIL_REPLICA": name},
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
                self.urls[name] = f"http://127.0.0.1:{port}"
            for name, url in self.urls.items():
                _wait_healthy(url, self.procs[name], timeout_s=90)
        except BaseException:
            self.__exit__()
            raise
        self.started_at = time.time()
        return self

    def stop(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                kill_tree(proc.pid)
                proc.wait()
        self.stopped.setdefault(name, time.time())

    def __exit__(self, *exc: object) -> None:
        for name in list(self.procs):
            self.stop(name)

    def healthy(self) -> list[str]:
        return [n for n in self.scenario.replicas if n != self.scenario.slow]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"model server {url} exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"model server {url} did not answer /health in {timeout_s} s")
        time.sleep(0.1)


def load(scenario: ServingScenario) -> list[TraceRequest]:
    """The trace's requests, arrivals scaled to ``rate_rps`` (and re-indexed)."""
    trace = read_trace(scenario.trace).requests
    scale = (len(trace) / trace[-1].arrival_s) / scenario.rate_rps
    return [replace(r, index=i, arrival_s=r.arrival_s * scale) for i, r in enumerate(trace)]


def calibrate(url: str, n: int = 16) -> Thresholds:
    """Thresholds a healthy replica meets and a ``slow_factor``-slow one misses, from a short
    replay against ``url`` (not reported, about 10 s): TPOT at 2x the healthy median (with
    engine steps paced to ``step_floor_s`` a healthy replica's TPOT stays near its median
    unless the host leaves it no CPU for a whole step, while a 3x-slow one's is at 3x or
    more: it queues as well), TTFT generous (the fault is judged on TPOT)."""
    trace = read_trace(TRACE, limit=n).requests
    trace = [replace(r, arrival_s=i * 0.5) for i, r in enumerate(trace)]
    outcomes = asyncio.run(
        Replay(trace, ReplayOptions(target=url), record=lambda *a: _NoRecord()).play()
    )
    tpot = sorted(t for o in outcomes if (t := o.tpot_s) is not None)
    ttft = sorted(t for o in outcomes if (t := o.ttft_s) is not None)
    if len(tpot) < n // 2 or not ttft:
        raise RuntimeError(f"calibration failed: {[o.error for o in outcomes if o.error][:3]}")
    return Thresholds(
        ttft_s=round(max(1.0, 5 * ttft[-1]), 3), tpot_s=round(2 * tpot[len(tpot) // 2], 5)
    )


class _NoRecord:
    def first_token(self, n: int = 1) -> None:
        pass

    def token(self, n: int = 1) -> None:
        pass

    def end(self, status: str = "ok", output_tokens: int | None = None) -> None:
        pass


def configure(
    base: str, admin: str, scenario: ServingScenario, th: Thresholds, *, webhook_url: str
) -> dict[str, Any]:
    """One SLO per job (the server's view and the client's), and a generic webhook for the
    server job; returns the webhook as created."""
    h = {"Authorization": f"Bearer {admin}"}
    for job in (scenario.server_job, scenario.client_job):
        slo = {
            "job": job,
            "name": "interactive",
            "ttft_s": th.ttft_s,
            "tpot_s": th.tpot_s,
            "objective": scenario.objective,
            "period_s": scenario.period_s,
        }
        httpx.post(f"{base}/api/v1/slos", json=slo, headers=h, timeout=30).raise_for_status()
    hook = {
        "name": "oncall",
        "url": webhook_url,
        "format": "generic",
        "jobs": [scenario.server_job],
    }
    reply = httpx.post(f"{base}/api/v1/webhooks", json=hook, headers=h, timeout=30)
    reply.raise_for_status()
    return dict(reply.json())


@dataclass
class Seen:
    """An incident as the load loop saw it: when it first appeared, and when it resolved."""

    id: int
    kind: str
    summary: str
    evidence: dict[str, Any]
    detected_at: float
    seen_at: float
    resolved_seen_at: float | None = None
    paged: bool = False  # a page tier fired in some evidence seen


@dataclass
class LoadResult:
    outcomes: list[Outcome]
    started_at: float  # epoch seconds: the load's start (the slow replica was slow already)
    slow_stopped_at: float | None
    incidents: dict[int, Seen]
    phase1_s: float
    phase2_s: float
    burn_after: list[dict[str, Any]]  # the server job's SLO tiers at the end of phase 2

    def first(self, kind: str) -> Seen | None:
        found = [s for s in self.incidents.values() if s.kind == kind]
        return min(found, key=lambda s: s.detected_at) if found else None


def incidents(base: str, read: str, job: str) -> list[dict[str, Any]]:
    h = {"Authorization": f"Bearer {read}"}
    reply = httpx.get(f"{base}/api/v1/jobs/{job}/incidents", headers=h, timeout=30)
    if reply.status_code == 404:
        return []
    reply.raise_for_status()
    return list(reply.json())


async def _replay(
    fleet: Fleet, names: list[str], requests: list[TraceRequest], stop: asyncio.Event
) -> list[Outcome]:
    """Round-robin over ``names``: one client per replica, each with every n-th request."""
    plays = [
        Replay(requests[i :: len(names)], ReplayOptions(target=fleet.urls[name]))
        for i, name in enumerate(names)
    ]
    done = await asyncio.gather(*(p.play(stop) for p in plays))
    return [o for outs in done for o in outs]


async def run_load(
    fleet: Fleet,
    base: str,
    read: str,
    *,
    on_incident: Callable[[Seen, str], None] | None = None,
    on_stop: Callable[[str, float], None] | None = None,
    poll_s: float = 2.0,
) -> LoadResult:
    """Phase 1 until ``slow_replica`` and ``slo_burn`` are both open (or ``phase1_max_s``);
    stop the slow replica; phase 2 on the healthy ones until every incident resolved (or
    ``phase2_max_s``), then read the SLO's tiers.
    ``on_incident(seen, "opened" | "resolved")``; ``on_stop(replica, seconds)``.

    The caller ships the client's records (``ship_to``) around this."""
    sc = fleet.scenario
    requests = load(sc)
    seen: dict[int, Seen] = {}

    def poll() -> None:
        for inc in incidents(base, read, sc.server_job):
            s = seen.get(inc["id"])
            if s is None:
                s = seen[inc["id"]] = Seen(
                    inc["id"],
                    inc["kind"],
                    inc["summary"],
                    inc["evidence"],
                    _epoch(inc["detected_at"]),
                    time.time(),
                )
                if on_incident:
                    on_incident(s, "opened")
            s.summary, s.evidence = inc["summary"], inc["evidence"]
            s.paged = s.paged or page_firing(inc["evidence"])
            if inc["status"] == "resolved" and s.resolved_seen_at is None:
                s.resolved_seen_at = time.time()
                if on_incident:
                    on_incident(s, "resolved")

    async def watch(stop: asyncio.Event, until: Callable[[], bool], max_s: float) -> None:
        deadline = time.monotonic() + max_s
        while not stop.is_set():
            await asyncio.sleep(poll_s)
            await asyncio.to_thread(poll)
            if until() or time.monotonic() > deadline:
                stop.set()

    def flagged() -> bool:
        kinds = {s.kind for s in seen.values()}
        return {"slow_replica", "slo_burn"} <= kinds

    def cleared() -> bool:
        """Every incident seen has resolved, and 20 s of the first minute without the slow
        replica have passed (every burn window is then that minute alone)."""
        stopped = fleet.stopped.get(sc.slow)
        quiet = stopped is not None and time.time() >= (stopped // 60 + 1) * 60 + 20
        return quiet and all(s.resolved_seen_at is not None for s in seen.values())

    started = time.time()
    stop1 = asyncio.Event()
    t0 = time.monotonic()
    out1, _ = await asyncio.gather(
        _replay(fleet, list(sc.replicas), requests, stop1),
        watch(stop1, flagged, sc.phase1_max_s),
    )
    phase1 = time.monotonic() - t0
    await asyncio.to_thread(fleet.stop, sc.slow)
    if on_stop:
        on_stop(sc.slow, phase1)
    sent = max(o.index for o in out1) + 1 if out1 else 0
    rest = requests[sent:]
    shift = rest[0].arrival_s if rest else 0.0
    rest = [replace(r, arrival_s=r.arrival_s - shift) for r in rest]
    stop2 = asyncio.Event()
    t1 = time.monotonic()
    out2, _ = await asyncio.gather(
        _replay(fleet, fleet.healthy(), rest, stop2),
        watch(stop2, cleared, sc.phase2_max_s),
    )
    phase2 = time.monotonic() - t1
    burn = await asyncio.to_thread(slo_burn_rates, base, read, sc.server_job)
    return LoadResult(out1 + out2, started, fleet.stopped.get(sc.slow), seen, phase1, phase2, burn)


def slo_burn_rates(base: str, read: str, job: str) -> list[dict[str, Any]]:
    """Each tier of the job's (first) SLO now: burn rates, counts, whether it fires."""
    h = {"Authorization": f"Bearer {read}"}
    reply = httpx.get(f"{base}/api/v1/jobs/{job}/slos", headers=h, timeout=60)
    reply.raise_for_status()
    slos = reply.json()
    return list(slos[0]["burn_rates"]) if slos else []


def page_firing(evidence: dict[str, Any]) -> bool:
    """Whether a page tier fires in an ``slo_burn`` incident's (latest) evidence."""
    return any(
        t.get("firing") and t.get("severity") == "critical" for t in evidence.get("tiers", [])
    )


def _epoch(iso: str) -> float:
    from datetime import UTC, datetime

    dt = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


def server_figures(base: str, read: str, job: str, since: float, until: float) -> dict[str, Any]:
    """What Vigil computed for ``job`` over [since, until]: TTFT p50 over the whole range (one
    bin of the serving chart) and the SLO's attainment."""
    h = {"Authorization": f"Bearer {read}"}
    q = {"since": since, "until": until}
    chart = httpx.get(
        f"{base}/api/v1/jobs/{job}/serving",
        params={**q, "max_points": 1},
        headers=h,
        timeout=60,
    )
    chart.raise_for_status()
    slos = httpx.get(f"{base}/api/v1/jobs/{job}/slos", params=q, headers=h, timeout=60)
    slos.raise_for_status()
    return {"chart": chart.json(), "slos": slos.json()}

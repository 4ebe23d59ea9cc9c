"""The load generator's node mode (``--relay``) plays the relay under overload as the relay
does: the heartbeat-only lines of a flush (ranks whose telemetry waits for a retry) go in a
request of their own, ahead of the telemetry, so a throttled telemetry request does not
take the node's heartbeats down with it; a heartbeat that rode along with refused telemetry
goes again at once, alone. The upstream is a stand-in that refuses any request with
telemetry in it while overloaded (``tests.collector.overloaded_upstream``)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

from bench.loadgen.generator import run
from bench.loadgen.options import Options
from tests.collector.overloaded_upstream import OverloadedUpstream, heartbeat_only

RANKS = 8
OVERLOAD_S = 1.5


def test_a_nodes_heartbeats_go_apart_from_its_throttled_telemetry() -> None:
    with OverloadedUpstream(retry_after="0") as upstream:
        upstream.overloaded.set()
        recover = threading.Timer(OVERLOAD_S, upstream.overloaded.clear)
        recover.start()
        opts = Options(
            endpoints=[upstream.url],
            token="t",
            ranks=RANKS,
            ranks_per_node=RANKS,
            relay=True,
            duration_s=2,
            step_s=0.25,
            flush_s=0.25,
            warmup_s=0,
            settle_s=0,
            drain_s=10,
            report_s=60,
            job_prefix="lane",
        )
        try:
            summary = asyncio.run(run(opts, out=lambda _: None))
        finally:
            recover.cancel()
        requests = upstream.snapshot()
        delivered = upstream.delivered()
    t = summary["totals"]
    assert t["throttled"] > 0  # telemetry was refused while overloaded
    assert t["heartbeats_lost"] == 0, t  # heartbeat-only lines never were
    refused = {beat_key(b) for r in requests if r.status == 429 for b in r.batches}
    refused.discard(None)
    alone = {beat_key(b) for b in delivered if heartbeat_only(b)}
    assert refused and refused <= alone  # each refused heartbeat went again, alone
    # Every acknowledged step arrived once, and nothing was left unsent.
    steps = Counter((b["rank"], e["step"]) for b in delivered for e in b["events"] if is_step(e))
    assert set(steps.values()) == {1}
    assert sum(steps.values()) == t["acked_steps"] > 0
    assert t["unsent_at_end"] == 0


def beat_key(batch: dict) -> tuple[int, float] | None:  # type: ignore[type-arg]
    """The batch's heartbeat, as (rank, ts)."""
    beats = [e["ts"] for e in batch["events"] if e["type"] == "heartbeat"]
    return (batch["rank"], beats[0]) if beats else None


def is_step(event: dict) -> bool:  # type: ignore[type-arg]
    return event["type"] == "step"

"""``python -m bench.loadgen``: a load run against a running Vigil; a table per interval,
then the JSON summary as the last line (and in ``--json FILE``).

    python -m bench.loadgen --endpoint http://127.0.0.1:8000 --token vigil-dev-ingest \\
        --read-token vigil-dev-admin --ranks 512 --step-s 1 --minutes 1 \\
        --faults straggler@20s:rank=7,hang@40s:rank=100 \\
        --database-url postgresql://postgres@127.0.0.1:5432/vigil \\
        --cpu api=re:'backend server' --cpu worker=re:'backend worker' \\
        --cpu beat=re:'backend beat' --cpu postgres=re:'^postgres' --cpu redis=re:redis-server

Exit status: 0 when every fault was found with the right ranks within its bound, nothing
acknowledged was lost, nothing was refused and no unexpected incident opened; 1 otherwise;
2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from bench.loadgen.faults import FaultSpecError, parse_faults
from bench.loadgen.generator import run
from bench.loadgen.options import Options


def _cpu(values: list[str]) -> dict[str, str]:
    out = {}
    for v in values:
        name, sep, spec = v.partition("=")
        if not sep or not name or not spec:
            raise ValueError(f"--cpu {v!r}: expected NAME=PIDS or NAME=re:PATTERN")
        out[name] = spec
    return out


def parse(argv: list[str] | None = None) -> tuple[Options, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__.split("\n")[0])
    p.add_argument(
        "--endpoint",
        action="append",
        required=True,
        help="Vigil base URL; repeat for API replicas (ranks are spread over them)",
    )
    p.add_argument("--token", required=True, help="ingest token")
    p.add_argument(
        "--read-token", help="token with the read scope, for incidents (default: --token)"
    )
    p.add_argument("--ranks", type=int, required=True, help="ranks per job")
    p.add_argument("--jobs", type=int, default=1, help="simulated jobs (default 1)")
    p.add_argument("--step-s", type=float, default=1.0, help="step time in seconds (default 1)")
    p.add_argument(
        "--tp", type=int, default=1, help="tensor-parallel group size (default 1: DDP only)"
    )
    p.add_argument("--ranks-per-node", type=int, default=8, help="ranks on one host (default 8)")
    p.add_argument(
        "--relay",
        action="store_true",
        help="ship through a per-host relay: one /api/v1/ingest/multi request per node and "
        "flush, as `vigil relay` sends (default: every rank its own request)",
    )
    p.add_argument("--minutes", type=float, default=1.0, help="how long to run (default 1)")
    p.add_argument(
        "--flush-s", type=float, default=1.0, help="each rank's flush interval (default 1)"
    )
    p.add_argument(
        "--faults",
        action="append",
        default=[],
        help="e.g. straggler@20s:rank=7:factor=1.5,hang@40s:rank=100,crash@50s:rank=8-15:job=1",
    )
    p.add_argument(
        "--job-prefix",
        default="",
        help="job names are PREFIX-0, PREFIX-1 … (default loadgen-<UTC time>)",
    )
    p.add_argument("--database-url", help="PostgreSQL URL: stored rows and database size")
    p.add_argument(
        "--cpu",
        action="append",
        default=[],
        help="NAME=PID[,PID…] or NAME=re:PATTERN: a component whose CPU to report "
        "(its descendants count too)",
    )
    p.add_argument(
        "--warmup-s",
        type=float,
        default=5.0,
        help="heartbeats only before the first step, the ranks initialising (default 5)",
    )
    p.add_argument("--report-s", type=float, default=60.0, help="table interval (default 60)")
    p.add_argument(
        "--settle-s",
        type=float,
        default=60.0,
        help="after the run, keep going at most this long while a fault is not found "
        "and not past its bound",
    )
    p.add_argument(
        "--connections", type=int, default=512, help="connections per endpoint (default 512)"
    )
    p.add_argument("--max-batch", type=int, default=5000)
    p.add_argument(
        "--max-queue", type=int, default=20_000, help="events a rank buffers before dropping"
    )
    p.add_argument(
        "--timeout-s", type=float, default=5.0, help="per request (default 5, as the collector)"
    )
    p.add_argument(
        "--no-goodbye", action="store_true", help="end without the ranks' exit heartbeats"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write the summary here")
    args = p.parse_args(argv)
    try:
        opts = Options(
            endpoints=args.endpoint,
            token=args.token,
            read_token=args.read_token,
            ranks=args.ranks,
            jobs=args.jobs,
            step_s=args.step_s,
            tp=args.tp,
            ranks_per_node=args.ranks_per_node,
            relay=args.relay,
            duration_s=args.minutes * 60,
            flush_s=args.flush_s,
            faults=[f for spec in args.faults for f in parse_faults(spec)],
            job_prefix=args.job_prefix,
            database_url=args.database_url,
            cpu=_cpu(args.cpu),
            report_s=args.report_s,
            settle_s=args.settle_s,
            warmup_s=args.warmup_s,
            connections=args.connections,
            max_batch=args.max_batch,
            max_queue=args.max_queue,
            timeout_s=args.timeout_s,
            goodbye=not args.no_goodbye,
            seed=args.seed,
        )
    except (FaultSpecError, ValueError) as exc:
        p.error(str(exc))
    return opts, args


def passed(summary: dict[str, Any]) -> bool:
    """The run's verdict (see the module's docstring)."""
    t, lost = summary["totals"], summary["lost"] or {}
    return (
        all(f["found"] and f["within_bound"] for f in summary["detection"]["faults"])
        and not summary["detection"]["unexpected"]
        and not any(lost.values())
        and not summary["stored"].get("duplicate_steps")
        and t["rejected"] == 0
    )


def main(argv: list[str] | None = None) -> int:
    opts, args = parse(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # optional: the stdlib loop works, at a higher CPU cost per request
        pass
    summary = asyncio.run(run(opts, out=lambda line: print(line, flush=True)))
    summary["passed"] = passed(summary)
    text = json.dumps(summary)
    if args.json:
        args.json.write_text(text)
    print(text, flush=True)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""The relay's command line: ``vigil relay …`` or ``python -m collector.relay …``.

    python -m collector.relay --listen 127.0.0.1:8765 --endpoint http://vigil:8000 \\
        --token "$VIGIL_TOKEN" [--flush-s 1.0] [--max-buffer-mb 64]

Options fall back to ``VIGIL_RELAY_LISTEN``, ``VIGIL_RELAY_ENDPOINT``, ``VIGIL_TOKEN`` and
``VIGIL_RELAY_FLUSH_S``. The relay runs until SIGTERM or SIGINT, then forwards what it holds
once more and answers every rank before it exits.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import urllib.parse
from collections.abc import Sequence
from types import FrameType

from collector.relay.buffer import Limits
from collector.relay.server import Relay, RelayConfig

MIB = 1024 * 1024


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``:PORT``, on the loopback) → (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"--listen takes HOST:PORT, not {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def parser() -> argparse.ArgumentParser:
    env = os.environ
    p = argparse.ArgumentParser(
        prog="vigil relay",
        description="Per-host relay: merges the node's ranks' ingest batches into one "
        "request per flush to the Vigil server. Point the ranks' VIGIL_ENDPOINT at --listen.",
    )
    p.add_argument(
        "--listen",
        type=parse_listen,
        default=parse_listen(env.get("VIGIL_RELAY_LISTEN", "127.0.0.1:8765")),
        help="HOST:PORT the ranks send to [VIGIL_RELAY_LISTEN; 127.0.0.1:8765]",
    )
    p.add_argument(
        "--endpoint",
        default=env.get("VIGIL_RELAY_ENDPOINT"),
        help="the Vigil server's URL [VIGIL_RELAY_ENDPOINT]",
    )
    p.add_argument(
        "--token",
        default=env.get("VIGIL_TOKEN"),
        help="ingest token: sent to the server, and required of the ranks [VIGIL_TOKEN]",
    )
    p.add_argument(
        "--flush-s",
        type=float,
        default=float(env.get("VIGIL_RELAY_FLUSH_S", "1.0")),
        help="longest a batch waits to be merged; sooner when every rank has sent [1.0]",
    )
    p.add_argument("--max-buffer-mb", type=float, default=64.0, help="held at most [64]")
    p.add_argument("--max-body-mb", type=float, default=8.0, help="one rank's batch [8]")
    p.add_argument("--flush-mb", type=float, default=4.0, help="one request's batches [4]")
    p.add_argument(
        "--reply-timeout-s",
        type=float,
        default=4.0,
        help="longest a rank waits for its answer; keep it under VIGIL_TIMEOUT_S [4.0]",
    )
    p.add_argument("--upstream-timeout-s", type=float, default=30.0, help="[30]")
    p.add_argument("--log-level", default="INFO")
    return p


def config_from(args: argparse.Namespace) -> RelayConfig:
    if not args.endpoint:
        raise SystemExit("vigil relay: --endpoint (or VIGIL_RELAY_ENDPOINT) is required")
    host, port = args.listen
    target = urllib.parse.urlsplit(args.endpoint)
    if target.hostname in (host, "localhost", "127.0.0.1") and target.port == port:
        raise SystemExit(f"vigil relay: --endpoint {args.endpoint} is the relay itself")
    if args.flush_s <= 0 or args.reply_timeout_s <= 0:
        raise SystemExit("vigil relay: --flush-s and --reply-timeout-s must be > 0")
    limits = Limits(
        flush_s=args.flush_s,
        max_bytes=int(args.max_buffer_mb * MIB),
        flush_bytes=int(args.flush_mb * MIB),
        active_s=max(5.0, 3 * args.flush_s),
    )
    return RelayConfig(
        endpoint=args.endpoint,
        token=args.token,
        host=host,
        port=port,
        limits=limits,
        max_body_bytes=int(args.max_body_mb * MIB),
        reply_timeout_s=args.reply_timeout_s,
        upstream_timeout_s=args.upstream_timeout_s,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = config_from(args)
    if not config.token:
        logging.getLogger("vigil.relay").warning(
            "relay: no --token: ranks are not asked for one and the server will refuse"
        )
    try:
        relay = Relay(config)
    except (OSError, ValueError) as exc:
        print(f"vigil relay: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    relay.start()
    print(
        f"vigil relay: {relay.url} → {relay.upstream.endpoint} "
        f"(flush every {config.limits.flush_s:g} s at most)",
        flush=True,
    )
    while not stop.wait(1.0):
        pass
    relay.stop()
    return 0

"""``python -m collector.relay``: the per-host relay (see ``collector.relay.cli``)."""

from __future__ import annotations

from collector.relay.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

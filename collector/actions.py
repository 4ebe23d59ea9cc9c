"""Built-in action handlers. Custom ones are registered with ``@vigil.on_action(kind)``.

A handler takes the action's ``params`` dict and returns a JSON-able dict, which is sent
back to the backend as the action's result.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collector.client import Client

log = logging.getLogger("vigil.collector")

# torchrun restarts the worker group when any worker exits non-zero (with --max-restarts);
# 75 is EX_TEMPFAIL: "try again", and easy to tell apart from a crash in the logs.
RESTART_EXIT_CODE = 75
MAX_FRAMES = 64


def dump_stacks(client: Client, params: dict[str, Any]) -> dict[str, Any]:
    """Every thread's Python stack, shipped as a ``stacks`` event."""
    names = {t.ident: t.name for t in threading.enumerate()}
    threads = []
    for ident, frame in sys._current_frames().items():
        stack = traceback.format_stack(frame, limit=MAX_FRAMES)
        threads.append(
            {
                "thread": names.get(ident, str(ident)),
                "ident": ident,
                "stack": [s.rstrip() for s in stack],
            }
        )
    client.event("stacks", threads=threads, pid=os.getpid(), reason=params.get("reason", ""))
    return {"threads": len(threads)}


def exit_for_restart(client: Client, code: int = RESTART_EXIT_CODE) -> None:
    """Flush what is buffered (bounded), then exit so the launcher restarts the group."""
    log.warning("vigil: exiting with code %d for a restart requested by Vigil", code)
    try:
        client.shutdown(client.config.exit_timeout_s)
    finally:
        sys.stderr.flush()
        time.sleep(0.05)
        os._exit(code)

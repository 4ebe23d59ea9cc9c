"""Built-in action handlers. Custom ones are registered with ``@vigil.on_action(kind)``.

A handler takes the action's ``params`` dict and returns a JSON-able dict, which is sent
back to the backend as the action's result. A result with ``"restart": True`` makes the
collector exit for a restart once the result is reported, e.g. a ``rollback`` handler
that sets the bad checkpoints aside and lets torchrun restart from the last good one::

    @vigil.on_action("rollback")
    def rollback(params):
        quarantine_checkpoints(from_step=params["from_step"])
        return {"restart": True}
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collector.client import Client

log = logging.getLogger("vigil.collector")

# torchrun restarts the worker group when any worker exits non-zero (with --max-restarts);
# 75 is EX_TEMPFAIL: "try again", and easy to tell apart from a crash in the logs.
RESTART_EXIT_CODE = 75
MAX_FRAMES = 64
RESTART_KINDS = ("exit_for_restart", "restart")
HANDLER_WAIT_S = 10.0  # how long an action waits for its handler to be registered

ActionHandler = Callable[[dict[str, Any]], Any]


class ActionRunner:
    """Runs actions from ingest replies, each on its own thread, and reports back.

    Each action id runs once per process (the backend re-sends until it hears back). The
    rank reports ``acked`` at once, then ``succeeded`` with the handler's result or
    ``failed`` with the error.
    """

    def __init__(self, client: Client) -> None:
        self.client = client
        self.handlers: dict[str, ActionHandler] = {
            "dump_stacks": lambda params: dump_stacks(client, params),
        }
        self._lock = threading.Lock()
        self._seen: set[str] = set()

    def register(self, kind: str, handler: ActionHandler) -> None:
        self.handlers[kind] = handler

    def dispatch(self, actions: list[dict[str, Any]]) -> None:
        for action in actions:
            action_id = str(action.get("id", ""))
            with self._lock:
                if not action_id or action_id in self._seen:
                    continue
                self._seen.add(action_id)
            threading.Thread(
                target=self.run, args=(action,), name="vigil-action", daemon=True
            ).start()

    def run(self, action: dict[str, Any]) -> None:
        kind = str(action.get("kind", ""))
        params = dict(action.get("params") or {})
        self.report(action, "acked", None)
        if kind in RESTART_KINDS:
            code = int(params.get("exit_code", RESTART_EXIT_CODE))
            # No flush of its own: the exit's one bounded flush carries it (two would let
            # the job run on for twice the exit timeout when the backend is slow).
            self.report(action, "succeeded", {"exit_code": code, "pid": os.getpid()}, flush=False)
            exit_for_restart(self.client, code)
            return
        handler = self._handler(kind)
        if handler is None:
            self.report(action, "failed", {"error": f"no handler for {kind!r} on this rank"})
            return
        try:
            result = handler(params)
        except Exception as exc:
            log.warning("vigil: action %s failed", kind, exc_info=True)
            self.report(action, "failed", {"error": f"{type(exc).__name__}: {exc}"})
            return
        if not isinstance(result, dict):
            result = {} if result is None else {"value": repr(result)[:1000]}
        restart = result.get("restart") is True
        self.report(action, "succeeded", result, flush=not restart)
        if restart:
            exit_for_restart(self.client, int(params.get("exit_code", RESTART_EXIT_CODE)))

    def _handler(self, kind: str) -> ActionHandler | None:
        """The handler for ``kind``; a process that started moments ago may not have
        registered it yet (the collector starts before the script's ``on_action`` lines
        run), so wait for it a little before giving up."""
        deadline = time.monotonic() + HANDLER_WAIT_S
        while (handler := self.handlers.get(kind)) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        return handler

    def report(
        self,
        action: dict[str, Any],
        state: str,
        result: dict[str, Any] | None,
        *,
        flush: bool = True,
    ) -> None:
        event: dict[str, Any] = {
            "type": "action",
            "id": action.get("id"),
            "state": state,
            "ts": time.time(),
        }
        if result is not None:
            event["result"] = result
        self.client.submit(event)
        if flush and state != "acked":  # the outcome goes out now, not with the next batch
            self.client.worker.flush(self.client.config.exit_timeout_s)


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
        client.shutdown(client.config.exit_timeout_s, exit_code=code)
    finally:
        sys.stderr.flush()
        time.sleep(0.05)
        os._exit(code)

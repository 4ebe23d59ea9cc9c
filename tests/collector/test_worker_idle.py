"""An idle worker sleeps: after the clean-exit goodbye the heartbeat tick has nothing to
send, and the worker must not spin on an expired flush deadline (it did: a core and the
GIL taken from the user's process until exit)."""

from __future__ import annotations

import time

from collector.config import Config
from collector.transport import HttpTransport
from collector.worker import Worker


def test_a_worker_with_nothing_to_send_does_not_spin():
    config = Config.resolve(endpoint="http://127.0.0.1:9", job="idle", heartbeat_s=0.2)
    transport = HttpTransport(config.endpoint or "", None, 1.0)
    worker = Worker(config, transport, tick=lambda: [], on_actions=lambda actions: None)
    worker._ensure_thread()
    try:
        cpu, wall = time.process_time(), time.monotonic()
        time.sleep(1.0)
        used = time.process_time() - cpu
        elapsed = time.monotonic() - wall
    finally:
        worker.shutdown(timeout=1.0)
    # A busy loop burns about a core for the whole second; a sleeping worker next to nothing.
    assert used < 0.3 * elapsed, f"{used:.2f} s of CPU in {elapsed:.2f} s: the worker spins"

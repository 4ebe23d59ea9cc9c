"""``vigil relay`` / ``python -m collector.relay``: options, refusals, and a clean stop."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from collector.relay.cli import config_from, parse_listen, parser
from tests.collector.relay_process import ROOT
from tests.servers import VIGIL, free_port


def test_listen_takes_host_and_port():
    assert parse_listen("127.0.0.1:8765") == ("127.0.0.1", 8765)
    assert parse_listen(":9000") == ("127.0.0.1", 9000)
    with pytest.raises(Exception, match="HOST:PORT"):
        parse_listen("8765")


def test_an_endpoint_is_required_and_may_not_be_the_relay_itself():
    with pytest.raises(SystemExit, match="--endpoint"):
        config_from(parser().parse_args([]))
    args = parser().parse_args(
        ["--listen", "127.0.0.1:8765", "--endpoint", "http://localhost:8765"]
    )
    with pytest.raises(SystemExit, match="is the relay itself"):
        config_from(args)
    config = config_from(parser().parse_args(["--endpoint", "http://vigil:8000", "--flush-s", "2"]))
    assert (config.port, config.limits.flush_s, config.limits.active_s) == (8765, 2.0, 6.0)


def test_vigil_relay_serves_until_sigterm_then_exits_cleanly():
    port = free_port()
    cmd = [*VIGIL, "relay", "--listen", f"127.0.0.1:{port}", "--endpoint", "http://127.0.0.1:9"]
    cmd += ["--token", "t"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().decode()
        assert f"http://127.0.0.1:{port}" in first and "http://127.0.0.1:9" in first
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
    help_text = subprocess.run(
        [sys.executable, "-m", "collector.relay", "--help"], capture_output=True, text=True
    )
    assert "--flush-s" in help_text.stdout and help_text.returncode == 0

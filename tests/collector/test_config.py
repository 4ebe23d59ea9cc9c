"""Collector configuration: arguments, then VIGIL_* and torchrun environment, then defaults."""

from __future__ import annotations

from collector.config import Config

TORCHRUN = {
    "RANK": "5",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "TORCHELASTIC_RESTART_COUNT": "2",
    "VIGIL_ENDPOINT": "http://vigil:8000/",
    "VIGIL_TOKEN": "tok",
    "VIGIL_JOB": "llama",
}


def test_torchrun_environment():
    cfg = Config.resolve(environ=TORCHRUN)
    assert (cfg.rank, cfg.world_size, cfg.local_rank, cfg.attempt) == (5, 8, 1, 2)
    assert (cfg.endpoint, cfg.token, cfg.job, cfg.enabled) == (
        "http://vigil:8000",
        "tok",
        "llama",
        True,
    )


def test_arguments_win_over_environment():
    cfg = Config.resolve(job="other", endpoint="http://x:1", environ=TORCHRUN)
    assert (cfg.job, cfg.endpoint) == ("other", "http://x:1")


def test_without_endpoint_the_collector_is_disabled():
    cfg = Config.resolve(environ={})
    assert not cfg.enabled
    assert (cfg.rank, cfg.world_size, cfg.job) == (0, 1, "default")


def test_malformed_environment_never_raises():
    cfg = Config.resolve(environ={"RANK": "abc", "WORLD_SIZE": "", "LOCAL_RANK": "1.5"})
    assert (cfg.rank, cfg.world_size, cfg.local_rank) == (0, 1, 0)

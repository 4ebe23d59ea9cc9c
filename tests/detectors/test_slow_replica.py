"""Slow replicas and queue build-up on synthetic serving fleets: per-request latencies drawn
at random, rolled up per replica and minute the way the backend does."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from detectors.registry import run
from detectors.slow_replica import (
    QueueConfig,
    SlowReplicaConfig,
    detect_queue_buildup,
    detect_slow_replicas,
)
from detectors.window import ServingWindow, Window

T0 = 28_000_000  # an epoch minute
NAMES = ("chat/a", "chat/b", "chat/c")


def _sums(
    rng: np.random.Generator,
    n: np.ndarray[Any, Any],
    base: float,
    sigma: float,
    factor: np.ndarray[Any, Any],
) -> np.ndarray[Any, Any]:
    """Per replica-minute sums of ``n`` lognormal latencies with median ``base × factor``."""
    out = np.zeros(n.shape)
    for (p, m), k in np.ndenumerate(n.astype(int)):
        if k:
            out[p, m] = rng.lognormal(np.log(base * factor[p, m]), sigma, k).sum()
    return out


def _fleet(
    seed: int,
    *,
    replicas: int = 3,
    minutes: int = 60,
    rate: float = 20.0,
    sigma: float = 0.8,
    slow: int | None = None,
    factor: float = 2.0,
    onset: int = 30,
    metric: str = "ttft",
) -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    shape = (replicas, minutes)
    n = rng.poisson(rate, shape).astype(float)
    mult = np.ones(shape)
    if slow is not None:
        mult[slow, onset:] = factor
    ones = np.ones(shape)
    return {
        "n": n,
        "ttft_sum": _sums(rng, n, 0.3, sigma, mult if metric == "ttft" else ones),
        "tpot_sum": _sums(rng, n, 0.04, sigma / 2, mult if metric == "tpot" else ones),
    }


def _detect(f: dict[str, Any], end: int | None = None) -> Any:
    cut = slice(0, end)
    names = NAMES if f["n"].shape[0] <= 3 else tuple(f"chat/{i}" for i in range(f["n"].shape[0]))
    return detect_slow_replicas(
        names[: f["n"].shape[0]],
        np.arange(T0, T0 + f["n"][:, cut].shape[1]),
        f["ttft_sum"][:, cut],
        f["n"][:, cut],
        f["tpot_sum"][:, cut],
        f["n"][:, cut],
    )


def _first_detection(f: dict[str, Any], replica: str, onset: int) -> int | None:
    for end in range(onset + 1, f["n"].shape[1] + 1):
        if any(x.key == f"slow_replica:{replica}" and x.active for x in _detect(f, end)):
            return end - onset
    return None


def test_a_2x_slow_replica_among_three_is_flagged_within_minutes() -> None:
    # 20 requests a minute per replica, per-request TTFT lognormal (σ = 0.6, CV 0.66).
    delays = [_first_detection(_fleet(s, slow=2, sigma=0.6), "chat/c", 30) for s in range(20)]
    assert None not in delays
    assert np.median(delays) <= 4 and max(delays) <= 10  # type: ignore[type-var]

    [f] = _detect(_fleet(3, slow=2, sigma=0.6))
    assert (f.kind, f.key, f.ranks, f.active) == ("slow_replica", "slow_replica:chat/c", (), True)
    assert f.evidence["replica"] == "chat/c" and f.evidence["metrics"] == ["ttft"]
    assert f.evidence["ttft"]["ratio"] == pytest.approx(2.0, rel=0.2)
    assert f.evidence["ttft"]["peers_median_s"] == pytest.approx(0.41, rel=0.2)  # lognormal mean
    assert T0 + 30 <= f.first_step <= T0 + 33 and f.last_step >= T0 + 57
    assert "chat/c" in f.summary and "TTFT" in f.summary


def test_a_slow_tpot_is_flagged_too() -> None:
    [f] = _detect(_fleet(5, slow=0, metric="tpot", factor=2.0))
    assert f.key == "slow_replica:chat/a" and f.evidence["metrics"] == ["tpot"]


def test_a_clean_noisy_fleet_raises_no_alarm() -> None:
    alarms = sum(len(_detect(_fleet(seed, replicas=3 + seed % 4))) for seed in range(200))
    assert alarms <= 2  # 200 hours of 3-6 replicas: 0 observed at these settings


def test_idle_minutes_are_ignored() -> None:
    f = _fleet(11, slow=2)
    # The slow replica serves under min_requests in its slow minutes: nothing to compare.
    quiet = {k: v.copy() for k, v in f.items()}
    quiet["n"][2, 30:] = np.minimum(quiet["n"][2, 30:], 3)
    quiet["ttft_sum"][2, 30:] = 0.6 * quiet["n"][2, 30:]
    assert _detect(quiet) == []
    # Idle minutes inside an episode neither count as recovered nor break it.
    gaps = {k: v.copy() for k, v in f.items()}
    gaps["n"][2, 40:50] = 0.0
    gaps["ttft_sum"][2, 40:50] = 0.0
    [g] = _detect(gaps)
    [h] = _detect(f)
    assert g.active and g.first_step == h.first_step
    # A healthy replica idle half the time is no alarm either.
    clean = _fleet(12)
    clean["n"][1, ::2] = 0.0
    clean["ttft_sum"][1, ::2] = 0.0
    assert _detect(clean) == []


def test_two_replicas_use_the_pair_ratio() -> None:
    slow = _fleet(21, replicas=2, slow=1, factor=2.5, sigma=0.4, rate=40)
    [f] = _detect(slow)
    assert f.key == "slow_replica:chat/b" and f.evidence["ttft"]["replicas_compared"] == 2
    mild = _fleet(22, replicas=2, slow=1, factor=1.3, sigma=0.4, rate=40)
    assert _detect(mild) == []


def test_a_recovered_replica_is_reported_inactive() -> None:
    f = _fleet(31, slow=2, minutes=70)
    f["ttft_sum"][2, 50:] /= 2.0  # back to normal from minute 50
    [g] = _detect(f)
    assert not g.active and T0 + 45 <= g.last_step <= T0 + 52
    assert "recovered" in g.summary


def test_a_replica_taken_out_of_rotation_resolves_within_two_minutes() -> None:
    f = _fleet(32, slow=2, minutes=60)
    for key in ("n", "ttft_sum", "tpot_sum"):
        f[key][2, 45:] = 0.0  # stopped at minute 45; its peers go on
    [active] = [x for x in _detect(f, 46) if x.key == "slow_replica:chat/c"]
    assert active.active  # one minute without it: not yet
    [gone] = [x for x in _detect(f, 47) if x.key == "slow_replica:chat/c"]
    assert not gone.active and gone.last_step == T0 + 44
    # A quiet replica (a few requests, under min_requests) is not out of rotation.
    quiet = _fleet(32, slow=2, minutes=60)
    quiet["n"][2, 45:] = 2.0
    quiet["ttft_sum"][2, 45:] = 2.0 * 0.6
    quiet["tpot_sum"][2, 45:] = 2.0 * 0.08
    [still] = [x for x in _detect(quiet, 47) if x.key == "slow_replica:chat/c"]
    assert still.active


def test_bad_shapes_are_refused() -> None:
    f = _fleet(1)
    with pytest.raises(ValueError):
        detect_slow_replicas(NAMES[:2], np.arange(60), f["ttft_sum"], f["n"])
    with pytest.raises(ValueError):
        SlowReplicaConfig(persist_k=6, persist_m=5)


# --- queue build-up --------------------------------------------------------------------------


def _window(
    names: tuple[str, ...],
    n: np.ndarray[Any, Any],
    ttft_sum: np.ndarray[Any, Any],
    queue_sum: np.ndarray[Any, Any] | None = None,
    arrivals: np.ndarray[Any, Any] | None = None,
) -> ServingWindow:
    m = n.shape[1]
    return ServingWindow(
        now=(T0 + m - 1) * 60.0 + 30.0,
        minutes=np.arange(T0, T0 + m, dtype=np.int64),
        slos=[],
        replicas=names,
        requests=n,
        errors=np.zeros_like(n),
        ttft_sum=ttft_sum,
        ttft_n=n,
        tpot_sum=0.04 * n,
        tpot_n=n,
        queue_sum=np.zeros_like(n) if queue_sum is None else queue_sum,
        queue_n=np.zeros_like(n) if queue_sum is None else n,
        arrivals=n if arrivals is None else arrivals,
    )


def _queue_fleet(seed: int, *, grow_from: int | None, minutes: int = 60) -> ServingWindow:
    """Four replicas of two models; the llama fleet's queue wait grows 0.5 s a minute."""
    rng = np.random.default_rng(seed)
    names = ("llama/0", "llama/1", "qwen/0", "qwen/1")
    n = rng.poisson(30, (4, minutes)).astype(float)
    wait = np.full((4, minutes), 0.2)
    if grow_from is not None:
        wait[:2, grow_from:] += 0.5 * np.arange(1, minutes - grow_from + 1)
    queue = _sums(rng, n, 1.0, 0.5, wait)
    ttft = queue + _sums(rng, n, 0.3, 0.5, np.ones((4, minutes)))
    return _window(names, n, ttft, queue)


def test_a_growing_queue_is_flagged_per_model() -> None:
    [f] = detect_queue_buildup(_queue_fleet(0, grow_from=40))
    assert (f.kind, f.key, f.active) == ("queue_buildup", "queue_buildup:llama", True)
    assert f.evidence["signal"] == "queue_s" and f.evidence["replicas"] == ["llama/0", "llama/1"]
    assert T0 + 35 <= f.first_step <= T0 + 48
    assert f.evidence["current_s"] > 4 * f.evidence["baseline_s"]
    assert len(f.evidence["arrivals"]) == len(f.evidence["completions"]) == 5


def test_a_steady_queue_is_not_flagged() -> None:
    assert sum(len(detect_queue_buildup(_queue_fleet(s, grow_from=None))) for s in range(50)) == 0


def test_queue_build_up_falls_back_to_ttft() -> None:
    w = _queue_fleet(1, grow_from=40)
    no_queue = _window(w.replicas, w.requests, w.ttft_sum)
    [f] = detect_queue_buildup(no_queue)
    assert f.evidence["signal"] == "ttft" and f.key == "queue_buildup:llama"


def test_a_queue_that_stops_growing_is_reported_inactive() -> None:
    w = _queue_fleet(2, grow_from=30, minutes=60)
    wait = w.queue_sum / w.queue_n
    flat = wait.copy()
    flat[:2, 45:] = wait[:2, 44:45]  # the wait levels off from minute 45
    stopped = _window(w.replicas, w.requests, w.ttft_sum, flat * w.queue_n)
    [f] = detect_queue_buildup(stopped, QueueConfig())
    assert not f.active and f.last_step <= T0 + 46


def test_the_registered_detectors_run_on_a_serving_window() -> None:
    f = _fleet(3, slow=2)
    w = _window(NAMES, f["n"], f["ttft_sum"])
    result = run(Window(serving=w))
    assert result.failures == []
    assert [x.key for x in result.findings] == ["slow_replica:chat/c"]
    assert {"slow_replica", "queue_buildup"} <= result.covered

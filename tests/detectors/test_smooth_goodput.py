"""Smooth goodput against a token-by-token reference (a simulated reader), and the two
pathologies of plain SLO metrics it is built to avoid."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from detectors.serving import meets, request_metrics
from detectors.smooth_goodput import (
    SmoothParams,
    idle_latencies,
    recorded_indices,
    request_smooth_score,
    smooth_goodput,
    smooth_scores,
)

P = SmoothParams()


def _reader_idle(times: list[float], v: float, ready: float | None = None) -> tuple[float, float]:
    """A user who reads each token in ``v`` seconds, ready to read at ``ready`` (default: the
    first token): the time they spend waiting for tokens, and when they finish the last."""
    ready = times[0] if ready is None else ready
    idle = max(0.0, times[0] - ready)
    start = max(times[0], ready)
    for t in times[1:]:
        ready = start + v  # done with the previous token
        if t > ready:
            idle += t - ready
        start = max(t, ready)
    return idle, start + v


def _ref_score(r: dict[str, Any], p: SmoothParams) -> float:
    times, status = r["times"], r["status"]
    n = len(times) if times else 0
    ready = None if p.ttft_s is None else r["arrival"] + p.ttft_s
    idle = 0.0
    if n:
        idle, done = _reader_idle(times, p.v_s, ready)
        if status == "aborted_by_client" and r["end"] > done:
            idle += r["end"] - done  # waiting for a token that never came
    elif status == "aborted_by_client" and ready is not None:
        idle = max(0.0, r["end"] - ready)  # gave up waiting for the first token
    if status in ("ok", "aborted_by_client"):
        return n - p.alpha * min(idle, p.idle_cap_s) / p.v_s
    return n - p.alpha * p.idle_cap_s / p.v_s


def _random_requests(rng: np.random.Generator, count: int) -> list[dict[str, Any]]:
    out = []
    for _ in range(count):
        arrival = float(rng.uniform(0, 100))
        status = str(rng.choice(["ok"] * 5 + ["error", "rejected", "aborted_by_client"]))
        n = 0 if status == "rejected" else int(rng.integers(0, 60))
        first = arrival + float(rng.exponential(1.0))
        # Mostly fast tokens with occasional stalls, so that buffers build and drain.
        gaps = np.where(rng.random(max(n - 1, 0)) < 0.05, rng.exponential(1.5), 0.0)
        gaps = gaps + rng.exponential(float(rng.choice([0.02, 0.05, 0.08])), max(n - 1, 0))
        times = (first + np.concatenate(([0.0], np.cumsum(gaps)))).tolist() if n else []
        end = (times[-1] if times else arrival) + float(rng.exponential(0.3))
        out.append({"arrival": arrival, "times": times, "end": end, "status": status})
    return out


def _scores(reqs: list[dict[str, Any]], p: SmoothParams) -> np.ndarray[Any, Any]:
    return smooth_scores(
        arrival=[r["arrival"] for r in reqs],
        first_token=[r["times"][0] if r["times"] else None for r in reqs],
        end=[r["end"] for r in reqs],
        output_tokens=[len(r["times"]) for r in reqs],
        status=[r["status"] for r in reqs],
        token_offsets=[
            [t - r["times"][0] for t in r["times"]] if r["times"] else None for r in reqs
        ],
        params=p,
    )


PARAMS = [P, SmoothParams(v_s=0.2, alpha=0.5, idle_cap_s=3.0), SmoothParams(ttft_s=1.0)]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("params", PARAMS, ids=["default", "slow-reader", "ttft"])
def test_scores_match_the_token_by_token_reference(seed: int, params: SmoothParams) -> None:
    reqs = _random_requests(np.random.default_rng(seed), 300)
    got = _scores(reqs, params)
    ref = [_ref_score(r, params) for r in reqs]
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-6)
    one = [
        request_smooth_score(
            arrival=r["arrival"],
            first_token=None,
            end=r["end"],
            output_tokens=len(r["times"]),
            token_times=r["times"] or None,
            status=r["status"],
            params=params,
        )
        for r in reqs[:50]
    ]
    np.testing.assert_allclose(one, ref[:50], rtol=1e-9, atol=1e-6)


@pytest.mark.parametrize("stride", [2, 4, 32])
def test_sampled_token_times_bound_the_idle_latency(stride: int) -> None:
    rng = np.random.default_rng(stride)
    for r in _random_requests(rng, 200):
        times = r["times"]
        if len(times) < 2:
            continue
        true_idle, _ = _reader_idle(times, P.v_s)
        idx = recorded_indices(len(times), stride)
        offsets = [times[i] - times[0] for i in idx]
        low, high = idle_latencies(
            first_token=[times[0]],
            end=[times[-1]],
            output_tokens=[len(times)],
            token_offsets=[offsets],
            stride=stride,
            v_s=P.v_s,
        )
        assert low[0] - 1e-9 <= true_idle <= high[0] + 1e-9
        assert high[0] - low[0] <= P.v_s * (stride - 1) + 1e-9


def test_without_token_times_the_last_token_bounds_below() -> None:
    low, high = idle_latencies(
        first_token=[1.0, 1.0], end=[3.0, 1.5], output_tokens=[21, 21], v_s=0.05
    )
    assert low.tolist() == pytest.approx([1.0, 0.0])  # 2 s for 20 tokens a reader reads in 1 s
    assert high.tolist() == pytest.approx([1.95, 0.45])  # all 20 at the end
    score = request_smooth_score(arrival=0.0, first_token=1.0, end=3.0, output_tokens=21)
    assert score == pytest.approx(21 - 1.0 / 0.05)


def test_mismatched_token_times_are_refused() -> None:
    with pytest.raises(ValueError, match="expected 4"):
        idle_latencies(
            first_token=[0.0], end=[1.0], output_tokens=[10], token_offsets=[[0.0, 0.5]], stride=4
        )


# --- (a) delaying tokens must not improve a request's score ---------------------------------


def _tbt(times: list[float]) -> np.ndarray[Any, Any]:
    return np.diff(np.asarray(times))


def test_delaying_tokens_smooths_tbt_but_does_not_improve_the_score() -> None:
    # 20 tokens: the first 10 in one burst, a 1 s stall, then 10 more every 10 ms.
    burst = [0.0] * 10 + [1.0 + 0.01 * j for j in range(10)]
    # The server holds the burst back and paces it out toward the stall: every token is
    # delivered no earlier than before.
    paced = [0.1 * i for i in range(10)] + burst[10:]
    assert all(b >= a for a, b in zip(burst, paced, strict=True))

    # A TBT-based SLO prefers the delayed delivery: max and p99 TBT fall about tenfold.
    assert _tbt(burst).max() == pytest.approx(1.0) and _tbt(paced).max() == pytest.approx(0.1)
    assert np.percentile(_tbt(paced), 99) < np.percentile(_tbt(burst), 99) / 5
    ms = request_metrics(
        arrival=[-0.2, -0.2],
        first_token=[0.0, 0.0],
        end=[burst[-1], paced[-1]],
        output_tokens=[20, 20],
        token_times=[burst, paced],
    )
    met = meets(ms, max_tbt_s=0.15)[0]
    assert met.tolist() == [False, True]

    # The user saw the same thing or worse: smooth goodput does not reward the delay.
    for params in (P, SmoothParams(v_s=0.02), SmoothParams(v_s=0.2)):
        before = request_smooth_score(
            arrival=-0.2,
            first_token=None,
            end=burst[-1],
            output_tokens=20,
            token_times=burst,
            params=params,
        )
        after = request_smooth_score(
            arrival=-0.2,
            first_token=None,
            end=paced[-1],
            output_tokens=20,
            token_times=paced,
            params=params,
        )
        assert after <= before + 1e-9


@pytest.mark.parametrize("seed", range(3))
def test_no_delay_ever_improves_a_score(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for r in _random_requests(rng, 200):
        if not r["times"]:
            continue
        delayed: list[float] = []
        for t in r["times"]:
            extra = float(rng.exponential(0.3)) if rng.random() < 0.3 else 0.0
            delayed.append(max(t + extra, delayed[-1] if delayed else t + extra))
        end = max(r["end"], delayed[-1])
        # Deadlines count from the first token unless ttft_s is set: then every token may
        # be delayed, else every token but the first (see the module docstring).
        later = [r["times"][0], *delayed[1:]]
        for params in PARAMS:
            times = later if params.ttft_s is None else delayed
            base = _ref_score(r, params)
            late = _ref_score({**r, "times": times, "end": end}, params)
            got = request_smooth_score(
                arrival=r["arrival"],
                first_token=None,
                end=end,
                output_tokens=len(times),
                token_times=times,
                status=r["status"],
                params=params,
            )
            assert got == pytest.approx(late, abs=1e-6)
            assert got <= base + 1e-6


# --- (b) dropping requests that would miss their SLO must not raise smooth goodput ----------


@pytest.mark.parametrize("seed", range(3))
def test_abandoning_a_request_never_raises_its_own_score(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for r in _random_requests(rng, 200):
        if r["status"] != "ok" or len(r["times"]) < 2:
            continue
        full = _ref_score(r, P)
        for k in range(0, len(r["times"])):
            cut = r["times"][:k]
            dropped = {
                **r,
                "times": cut,
                "end": cut[-1] if cut else r["arrival"],
                "status": "error",
            }
            assert _ref_score(dropped, P) <= full


def _fcfs(abandon: bool, *, e2e_slo: float = 6.0, probe: int = 10) -> list[dict[str, Any]]:
    """One server, one request at a time: 20 requests arrive a second apart, each needs
    0.1 s of prefill and 100 tokens at 20 ms — 2.1 s of work, so a queue builds. With
    ``abandon``, the server drops a request after ``probe`` tokens when it can see the
    request will end past its E2E target, and moves on to the next."""
    free, out = 0.0, []
    for r in range(20):
        arrival = float(r)
        first = max(arrival, free) + 0.1
        times = first + 0.02 * np.arange(100)
        status = "ok"
        if abandon and times[-1] > arrival + e2e_slo:
            times, status = times[:probe], "error"
        free = float(times[-1])
        out.append({"arrival": arrival, "times": times.tolist(), "end": free, "status": status})
    return out


@pytest.mark.parametrize("params", [P, SmoothParams(ttft_s=2.0)], ids=["default", "ttft"])
def test_dropping_late_requests_raises_goodput_but_not_smooth_goodput(
    params: SmoothParams,
) -> None:
    served, dropped = _fcfs(abandon=False), _fcfs(abandon=True)
    until = max(r["end"] for r in served) + 1.0  # one range that holds every request

    def plain(reqs: list[dict[str, Any]]) -> float:
        m = request_metrics(
            arrival=[r["arrival"] for r in reqs],
            first_token=[r["times"][0] for r in reqs],
            end=[r["end"] for r in reqs],
            output_tokens=[len(r["times"]) for r in reqs],
            status=[r["status"] for r in reqs],
        )
        joint, _ = meets(m, e2e_s=6.0)
        return float(joint.sum()) / until

    def smooth(reqs: list[dict[str, Any]]) -> float:
        return smooth_goodput(
            _scores(reqs, params), [r["end"] for r in reqs], since=0.0, until=until
        )

    assert plain(dropped) > 2 * plain(served)  # 10 good requests instead of 4
    assert smooth(dropped) < smooth(served)


def test_delaying_the_first_token_is_a_trade_only_ttft_s_prices() -> None:
    # Tokens 0..9 at once, then a 1 s stall: a reader at 20 tokens/s idles 0.5 s.
    times = [0.0] * 10 + [1.0 + 0.01 * j for j in range(10)]
    held = [0.5] * 10 + times[10:]  # the server holds the first 10 tokens back 0.5 s

    def score(ts: list[float], params: SmoothParams) -> float:
        return request_smooth_score(
            arrival=-0.3,
            first_token=None,
            end=ts[-1],
            output_tokens=20,
            token_times=ts,
            params=params,
        )

    # From the first token (the default), the later first token moves every deadline:
    # the idle half second is gone, and the longer TTFT is for the TTFT threshold to judge.
    assert score(held, P) > score(times, P)
    # With deadlines from arrival + ttft_s, holding tokens back never pays.
    with_ttft = SmoothParams(ttft_s=0.5)
    assert score(held, with_ttft) <= score(times, with_ttft)

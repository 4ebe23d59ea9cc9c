"""Smooth goodput: a per-request score from token delivery times, summed over requests.

    >>> p = SmoothParams(v_s=0.05, alpha=1.0, idle_cap_s=10.0)     # the defaults
    >>> on_time = [0.05 * i for i in range(100)]                    # every token by its deadline
    >>> request_smooth_score(arrival=0.0, first_token=0.5, end=5.45, output_tokens=100,
    ...                      token_offsets=on_time, params=p)
    100.0
    >>> stalled = [0.05 * i + (2.0 if i >= 50 else 0.0) for i in range(100)]   # a 2 s stall
    >>> round(request_smooth_score(arrival=0.0, first_token=0.5, end=7.45, output_tokens=100,
    ...                            token_offsets=stalled, params=p), 6)   # 100 - 2 s / 0.05 s
    60.0
    >>> request_smooth_score(arrival=0.0, first_token=0.5, end=3.0, output_tokens=50,
    ...                      token_offsets=on_time[:50], status="error", params=p)
    -150.0

After Wang et al., "Revisiting Service Level Objectives and System Level Metrics in Large
Language Model Serving" (arXiv 2410.14257v2): per-token deadlines that grow with the user's
reading speed, the *user idle latency* of a request, a *benefit* per request that counts the
tokens delivered less a penalty for idle latency, and smooth goodput = the benefits summed
over requests, per second. **Provenance**: this module was written from the paper's abstract
and from summaries of its §3–4 (deadlines ``d_i = V × i`` counted from the first token, user
idle latency ``l_r``, ``benefit(r) = n_r − α·f(l_r)``, smooth goodput ``= Σ_r benefit(r) / T``);
the text of §3–4 could not be read, so no equation numbers are cited, and the penalty
``f`` and the defaults below are this module's choices, not the paper's. Definitions, for a
request with output tokens ``i = 0 … n−1`` delivered at times ``t_i`` (``t_0`` the first token):

1. **Deadlines** ``d_i = t_0 + V·i``: a user reading one token every ``V`` seconds
   (``v_s``; default 0.05 s, 20 tokens/s) needs token ``i`` by then.
2. **User idle latency** ``l = max_i (t_i − d_i)`` (≥ 0: the ``i = 0`` term is 0). This is
   exactly the time such a user sits idle waiting for tokens: if they start token ``i`` at
   ``s_i = max(t_i, s_{i−1} + V)`` (``s_0 = t_0``), their idle time is
   ``s_{n−1} − t_0 − V·(n−1) = max_i (t_i − t_0 − V·i)``. A burst of early tokens is a
   buffer that absorbs a later stall. With ``ttft_s`` set, the deadlines count from
   ``arrival + ttft_s`` instead (``d_i = arrival + ttft_s + V·i``, the user is ready to read
   that long after asking): ``l = max(0, max_i (t_i − d_i))`` then includes a late first
   token, and a fast one is slack for later tokens. Default: from the first token.
3. **Benefit** ``b = n − α · min(l, L) / V``: the tokens delivered less the tokens' worth
   of reading time the user lost idle (``α`` = ``alpha``, default 1), the penalty capped at
   ``L`` = ``idle_cap_s`` seconds (default 10 s, i.e. 200 tokens). So ``f(l) = min(l, L)/L``
   and the summary's ``α`` is ``alpha·L/V`` here.
4. **Smooth goodput** over a time range of ``T`` seconds: ``Σ b`` over the requests that ended
   in it, divided by ``T`` (tokens/s). It is a sum of per-request terms, so each request's
   ``b`` is computed once (at ingest) and the backend sums them per minute.

**Statuses.** ``ok``: as above. ``error`` and ``rejected``: the rest of the output never
comes (``l = ∞``), so ``b = n_delivered − α·L/V``. ``aborted_by_client``: the user left at
``end`` after ``k`` tokens; their idle latency counts the wait for token ``k`` up to then:
``l = max(l_k, end − d_k)``, and no further penalty (the server did not fail).

**The two pathologies** (the paper's motivation), as properties of ``b``:
(a) delaying any token never raises ``b`` (``l`` only grows when a ``t_i`` grows), even when it
evens out the gaps and so improves max TBT or a TBT percentile. With the default deadlines
(from the first token) this holds for every token *but the first*: delaying the first token
moves every deadline, trading TTFT for idle latency, so judge TTFT by its own SLO threshold
or set ``ttft_s``, with which it holds for every token; (b) abandoning a request
after ``k`` of its ``n`` tokens never raises its own ``b``:
``k − α·L/V ≤ n − α·min(l, L)/V`` for any ``l`` (as long as the dropped request is reported
as ``error``, not as a short ``ok``), while plain goodput counts a request that
misses its SLO as 0 whether it is finished or dropped, so dropping it to free capacity is
free there. (Freed capacity can still help other requests; :mod:`tests.detectors.
test_smooth_goodput` shows a queue where dropping raises goodput and lowers smooth goodput.)

**Sampled token times.** The collector records every ``k``-th token (``stride``) of long
outputs: indices ``0, k, 2k, …`` and ``n−1``. ``l`` over the recorded tokens is a lower bound
of the true one, exact for ``k = 1``; the true value is at most ``V·(k−1)`` higher (a token
between two recorded ones is no later than the next recorded one and its deadline no
earlier than the previous one's plus ``V``), so the score overstates ``b`` by at most
``α·(k−1)`` tokens. :func:`idle_latencies` returns both bounds. Without token times, ``l`` is
bounded below by the last token alone, ``max(0, end − t_0 − V·(n−1))`` — exact when the
tokens came evenly spaced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from detectors.serving import ABORTED, OK, status_codes

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

__all__ = [
    "DEFAULT_PARAMS",
    "SmoothParams",
    "idle_latencies",
    "recorded_indices",
    "request_smooth_score",
    "smooth_goodput",
    "smooth_scores",
]


@dataclass(frozen=True)
class SmoothParams:
    """v_s: ``V``, seconds per token of the user's reading (1 / reading speed).
    alpha: weight of the idle penalty (tokens lost per token's worth of idle time).
    idle_cap_s: ``L``, idle seconds past which the penalty stops growing; a request the
        server failed pays it in full.
    ttft_s: when set, deadlines count from ``arrival + ttft_s`` rather than from the first
        token, so the wait for the first token counts too (beyond ``ttft_s``).
    """

    v_s: float = 0.05
    alpha: float = 1.0
    idle_cap_s: float = 10.0
    ttft_s: float | None = None

    def __post_init__(self) -> None:
        if not self.v_s > 0 or not self.idle_cap_s > 0 or self.alpha < 0:
            raise ValueError("need v_s > 0, idle_cap_s > 0 and alpha >= 0")
        if self.ttft_s is not None and self.ttft_s < 0:
            raise ValueError("ttft_s must be >= 0")

    @property
    def full_penalty(self) -> float:
        """The penalty of a failed request, in tokens: ``alpha · L / V``."""
        return self.alpha * self.idle_cap_s / self.v_s


DEFAULT_PARAMS = SmoothParams()


def recorded_indices(output_tokens: int, stride: int) -> IntArray:
    """The token indices a record with ``stride`` carries: 0, k, 2k, … below n, and n − 1.

    >>> recorded_indices(10, 4).tolist(), recorded_indices(3, 1).tolist()
    ([0, 4, 8, 9], [0, 1, 2])
    """
    if output_tokens <= 0:
        return np.zeros(0, dtype=np.int64)
    idx = np.arange(0, output_tokens, max(1, stride), dtype=np.int64)
    if idx[-1] != output_tokens - 1:
        idx = np.append(idx, output_tokens - 1)
    return idx


def _per_request(values: Any, n: int, dtype: type) -> npt.NDArray[Any]:
    if values is None:
        return np.full(n, np.nan, dtype=np.float64)
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    if arr.size == 1 and n != 1:
        arr = np.full(n, arr[0])
    if arr.size != n:
        raise ValueError(f"expected {n} values, got {arr.size}")
    return arr.astype(dtype) if dtype is not np.float64 else arr


def idle_latencies(
    *,
    first_token: Any,
    end: Any,
    output_tokens: Any,
    token_offsets: Sequence[Any | None] | None = None,
    stride: Any = 1,
    v_s: float = DEFAULT_PARAMS.v_s,
) -> tuple[FloatArray, FloatArray]:
    """``(low, high)`` bounds on each request's user idle latency ``max_i (t_i − d_i)``
    (seconds; the streaming part only: no TTFT, no abort wait). Equal for stride 1.

    ``token_offsets``: per request, the recorded tokens' times in seconds after
    ``first_token`` (token 0 first, so ``0.0``), or ``None``; ``stride``: per request or one.
    Requests without a first token have 0.

    >>> low, high = idle_latencies(first_token=[0.0], end=[1.0], output_tokens=[9],
    ...                            token_offsets=[[0.0, 0.5, 0.6]], stride=4, v_s=0.1)
    >>> [round(float(x), 3) for x in (low[0], high[0])]    # tokens 0, 4, 8 recorded
    [0.1, 0.4]
    """
    first = np.asarray(first_token, dtype=np.float64).reshape(-1)
    count = first.size
    end_f = _per_request(end, count, np.float64)
    n_tok = _per_request(output_tokens, count, np.float64)
    strides = np.maximum(_per_request(stride, count, np.float64), 1).astype(np.int64)
    has_first = np.isfinite(first)

    # Without token times: the last token (at ``end``) bounds below; all tokens at ``end``
    # bounds above.
    span = end_f - first
    with np.errstate(invalid="ignore"):
        low = np.where(n_tok >= 2, np.maximum(span - v_s * (n_tok - 1), 0.0), 0.0)
        high = np.where(n_tok >= 2, np.maximum(span - v_s, 0.0), 0.0)
    low = np.where(has_first & np.isfinite(low), low, 0.0)
    high = np.where(has_first & np.isfinite(high), high, 0.0)

    if token_offsets is not None:
        if len(token_offsets) != count:
            raise ValueError(f"expected {count} token_offsets entries, got {len(token_offsets)}")
        rows, values, nexts, starts = [], [], [], []
        total = 0
        for r, offsets in enumerate(token_offsets):
            if offsets is None or not has_first[r]:
                continue
            t = np.asarray(offsets, dtype=np.float64).reshape(-1)
            if t.size == 0:
                continue
            k = int(strides[r])
            n = int(n_tok[r]) if np.isfinite(n_tok[r]) else (t.size if k == 1 else -1)
            idx = recorded_indices(n, k)
            if idx.size != t.size:
                raise ValueError(
                    f"request {r}: {t.size} token times for {n} tokens at stride {k} "
                    f"(expected {idx.size})"
                )
            rows.append(r)
            values.append(t - v_s * idx)
            # Upper bound per gap: the next recorded time against the earliest deadline of
            # a token between them.
            nexts.append(np.append(t[1:] - v_s * (idx[:-1] + 1), t[0]))
            starts.append(total)
            total += t.size
        if rows:
            flat = np.concatenate(values)
            at = np.asarray(starts, dtype=np.intp)
            row_low = np.maximum(np.maximum.reduceat(flat, at), 0.0)
            row_high = np.maximum(np.maximum.reduceat(np.concatenate(nexts), at), row_low)
            low[rows] = row_low
            high[rows] = row_high
    return low, high


def smooth_scores(
    *,
    arrival: Any,
    first_token: Any,
    end: Any,
    output_tokens: Any,
    status: Any = None,
    token_offsets: Sequence[Any | None] | None = None,
    stride: Any = 1,
    params: SmoothParams = DEFAULT_PARAMS,
) -> npt.NDArray[np.float64]:
    """Each request's benefit ``b`` (tokens), vectorised over requests (see the module
    docstring). Arguments as :func:`idle_latencies`; ``status`` as
    :func:`detectors.serving.status_codes` (``None``: all ``ok``)."""
    arr = np.asarray(arrival, dtype=np.float64).reshape(-1)
    count = arr.size
    first = _per_request(first_token, count, np.float64)
    end_f = _per_request(end, count, np.float64)
    n_tok = _per_request(output_tokens, count, np.float64)
    codes = status_codes(status, count)
    if codes.size != count:
        raise ValueError(f"expected {count} statuses, got {codes.size}")
    has_first = np.isfinite(first)
    v = params.v_s

    idle, _ = idle_latencies(
        first_token=first,
        end=end_f,
        output_tokens=n_tok,
        token_offsets=token_offsets,
        stride=stride,
        v_s=v,
    )
    # Tokens delivered: the count, else what the token times show, else the first token.
    delivered = np.where(np.isfinite(n_tok), n_tok, has_first.astype(np.float64))
    if token_offsets is not None:
        for r, offsets in enumerate(token_offsets):
            if offsets is not None and not np.isfinite(n_tok[r]):
                delivered[r] = len(offsets)
    delivered = np.where(has_first, np.maximum(delivered, 1.0), 0.0)

    aborted = codes == ABORTED
    if aborted.any():  # the wait for the token that never came, up to the abort
        wait = end_f - first - v * delivered
        idle = np.where(aborted & has_first & (wait > idle), wait, idle)
    if params.ttft_s is not None:  # deadlines from arrival + ttft_s: shift by the lateness
        waited = np.where(has_first, first, end_f) - arr
        shift = np.nan_to_num(waited - params.ttft_s, nan=0.0)
        idle = np.where(has_first | aborted, np.maximum(idle + shift, 0.0), idle)

    penalty = params.alpha * np.minimum(idle, params.idle_cap_s) / v
    failed = (codes != OK) & ~aborted
    penalty = np.where(failed, params.full_penalty, penalty)
    return np.asarray(delivered - penalty, dtype=np.float64)


def request_smooth_score(
    *,
    arrival: float,
    first_token: float | None,
    end: float | None,
    output_tokens: int | None,
    token_offsets: Sequence[float] | None = None,
    token_times: Sequence[float] | None = None,
    stride: int = 1,
    status: str = "ok",
    params: SmoothParams = DEFAULT_PARAMS,
) -> float:
    """One request's benefit ``b`` (tokens): :func:`smooth_scores` for a single request.
    Token times come as ``token_offsets`` (seconds after ``first_token``) or as absolute
    ``token_times`` (token 0 first; it is the first token when ``first_token`` is None)."""
    if token_times is not None and token_offsets is None and len(token_times) > 0:
        times = np.asarray(token_times, dtype=np.float64)
        if first_token is None:
            first_token = float(times[0])
        token_offsets = (times - float(first_token)).tolist()
    scores = smooth_scores(
        arrival=[arrival],
        first_token=[first_token],
        end=[end],
        output_tokens=[output_tokens],
        status=[status],
        token_offsets=None if token_offsets is None else [token_offsets],
        stride=[stride],
        params=params,
    )
    return float(scores[0])


def smooth_goodput(scores: Any, end: Any, *, since: float, until: float) -> float:
    """Smooth goodput over ``[since, until)``: the benefits of the requests that ended in
    the range, summed, per second (tokens/s).

    >>> smooth_goodput([100.0, 60.0, -150.0], [5.0, 7.0, 70.0], since=0.0, until=60.0)
    2.6666666666666665
    """
    seconds = float(until) - float(since)
    if seconds <= 0:
        raise ValueError("until must be after since")
    b = np.asarray(scores, dtype=np.float64).reshape(-1)
    t = np.asarray(end, dtype=np.float64).reshape(-1)
    inside = (t >= since) & (t < until)
    return float(np.nansum(b[inside]) / seconds)

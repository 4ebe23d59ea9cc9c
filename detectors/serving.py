"""Per-request serving metrics and SLO judgement, as vLLM's serving benchmark defines them.

    >>> m = request_metrics(arrival=[0.0, 0.0, 1.0], first_token=[0.2, 0.9, None],
    ...                     end=[2.2, 1.0, 1.5], output_tokens=[101, 1, 0],
    ...                     status=["ok", "ok", "rejected"])
    >>> m.ttft.tolist(), m.tpot.tolist()
    ([0.2, 0.9, nan], [0.02, nan, nan])
    >>> joint, per = meets(m, ttft_s=0.5, tpot_s=0.05)
    >>> joint.tolist(), per["ttft_s"].tolist(), per["tpot_s"].tolist()
    ([True, False, False], [True, False, False], [True, True, False])
    >>> attainment(m, ttft_s=0.5, tpot_s=0.05)
    0.3333333333333333
    >>> goodput(m, joint, since=0.0, until=10.0)
    Goodput(requests_per_s=0.1, tokens_per_s=10.1, good=1, seconds=10.0)

Every function takes arrays of requests (a scalar is one request), so the backend calls the
same code per ingest batch and over a stored range. Definitions (per request):

- **TTFT** = ``first_token - arrival``; NaN without a first token.
- **TPOT** = ``(end - first_token) / (output_tokens - 1)``; NaN (undefined) for outputs of at
  most one token, and when the token count is unknown.
- **E2E** = ``end - arrival``; NaN while the request has not ended.
- **max TBT**: the largest gap between consecutive token deliveries, from ``token_times``
  (every token's time) when given, else the reported ``max_tbt_s``; NaN for ≤ 1 token.

**Judgement** (:func:`meets`). A threshold left ``None`` is not part of the SLO. A request
meets a threshold when its value is ``<=`` it. Undefined values: a request without a first
token misses TTFT; one that has not ended misses E2E; an undefined TPOT (≤ 1 output token)
*meets* TPOT, as in vLLM's goodput; an unknown max TBT (``max_tbt_s`` not reported) is
judged by its lower bound, the TPOT (the mean gap is never more than the largest gap), and
one of ≤ 1 token meets. ``joint`` is True when every threshold set is met.

**Statuses** (:data:`STATUSES`): only ``ok`` requests can meet anything. ``error`` and
``rejected`` miss every threshold. ``aborted_by_client`` (the user left) counts as a miss of
every threshold only if the request had *already* missed one when it was aborted (its TTFT
so far — the wait without a first token counts —, its TPOT or max TBT so far, or its E2E at
the abort exceeded a threshold); otherwise the user left for reasons of their own and the
request is *not judged*: it is in neither the good nor the total counts. :func:`judged` gives
that mask; :func:`attainment` divides by it. Unknown status strings count as ``error``.

**Goodput** (:func:`goodput`, DistServe, arXiv 2401.09670): requests per second, over a time
range, that ended in it and met every threshold of the SLO; and the output tokens per second
of those requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

__all__ = [
    "ABORTED",
    "ERROR",
    "OK",
    "REJECTED",
    "STATUSES",
    "THRESHOLDS",
    "Goodput",
    "RequestMetrics",
    "attainment",
    "goodput",
    "judged",
    "meets",
    "percentiles",
    "request_metrics",
    "status_codes",
]

STATUSES = ("ok", "error", "aborted_by_client", "rejected")
OK, ERROR, ABORTED, REJECTED = 0, 1, 2, 3
THRESHOLDS = ("ttft_s", "tpot_s", "max_tbt_s", "e2e_s")
_CODE = {name: code for code, name in enumerate(STATUSES)}


def status_codes(status: Any, n: int | None = None) -> IntArray:
    """Status names (or codes) as codes of :data:`STATUSES`: ``None`` is ``ok``, an unknown
    name is ``error``. ``status=None`` means every one of ``n`` requests is ``ok``.

    >>> status_codes(["ok", None, "aborted_by_client", "timeout", 3]).tolist()
    [0, 0, 2, 1, 3]
    """
    if status is None:
        return np.zeros(n or 0, dtype=np.int64)
    if isinstance(status, (str, int, np.integer)):
        status = [status]
    arr = np.asarray(status)
    if arr.dtype.kind in "iu":
        codes = arr.astype(np.int64).reshape(-1)
        return np.where((codes >= 0) & (codes < len(STATUSES)), codes, ERROR)
    if arr.dtype.kind in "US":  # strings: one comparison per known status
        flat = arr.reshape(-1).astype(str)
        codes = np.full(flat.size, ERROR, dtype=np.int64)
        for name, code in _CODE.items():
            codes[flat == name] = code
        return codes
    # Mixed values (None, names, numbers): each distinct one is looked up once.
    seen: dict[Any, int] = {}
    out = [seen[v] if v in seen else seen.setdefault(v, _code(v)) for v in arr.reshape(-1)]
    return np.asarray(out, dtype=np.int64)


def _code(value: Any) -> int:
    if value is None:
        return OK
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value) if 0 <= int(value) < len(STATUSES) else ERROR
    return _CODE.get(str(value), ERROR)


@dataclass(frozen=True)
class RequestMetrics:
    """Per-request inputs and metrics, one entry per request (seconds; NaN = unknown)."""

    arrival: FloatArray
    first_token: FloatArray
    end: FloatArray
    output_tokens: FloatArray
    status: IntArray
    ttft: FloatArray
    tpot: FloatArray
    e2e: FloatArray
    max_tbt: FloatArray

    def __len__(self) -> int:
        return int(self.arrival.size)


def _floats(values: Any, n: int) -> FloatArray:
    """A float array of ``n`` (None → NaN); a scalar or None is broadcast."""
    if values is None:
        return np.full(n, np.nan)
    out = np.asarray(values, dtype=np.float64).reshape(-1)  # None in a list becomes NaN
    if out.size == 1 and n != 1:
        out = np.full(n, out[0])
    if out.size != n:
        raise ValueError(f"expected {n} values, got {out.size}")
    return out


def _max_gap(times: Any) -> float:
    t = np.asarray(times, dtype=np.float64).reshape(-1)
    return float(np.max(np.diff(t))) if t.size >= 2 else np.nan


def request_metrics(
    *,
    arrival: Any,
    first_token: Any = None,
    end: Any = None,
    output_tokens: Any = None,
    max_tbt_s: Any = None,
    status: Any = None,
    token_times: Sequence[Any] | None = None,
) -> RequestMetrics:
    """TTFT, TPOT, E2E and max TBT of each request (see the module docstring).

    Arguments are arrays (or lists with ``None`` for unknown values, or scalars for one
    request). ``token_times``: per request, every output token's delivery time (absolute
    seconds, stride 1) or ``None``; when given with ≥ 2 tokens it sets the max TBT.

    >>> m = request_metrics(arrival=5.0, first_token=5.25, end=6.5, output_tokens=6,
    ...                     token_times=[[5.25, 5.5, 5.75, 6.0, 6.25, 6.5]])
    >>> float(m.ttft[0]), float(m.tpot[0]), float(m.e2e[0]), float(m.max_tbt[0])
    (0.25, 0.25, 1.5, 0.25)
    """
    arrival_f = np.asarray(arrival, dtype=np.float64).reshape(-1)
    n = arrival_f.size
    first = _floats(first_token, n)
    end_f = _floats(end, n)
    tokens = _floats(output_tokens, n)
    reported_tbt = _floats(max_tbt_s, n)
    codes = status_codes(status, n)
    if codes.size != n:
        raise ValueError(f"expected {n} statuses, got {codes.size}")

    ttft = first - arrival_f
    e2e = end_f - arrival_f
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(tokens >= 2, (end_f - first) / (tokens - 1), np.nan)
    max_tbt = np.where(tokens <= 1, np.nan, reported_tbt)
    if token_times is not None:
        if len(token_times) != n:
            raise ValueError(f"expected {n} token_times entries, got {len(token_times)}")
        for i, times in enumerate(token_times):
            if times is not None and len(times) >= 2:
                max_tbt[i] = _max_gap(times)
    return RequestMetrics(
        arrival=arrival_f,
        first_token=first,
        end=end_f,
        output_tokens=tokens,
        status=codes,
        ttft=ttft,
        tpot=tpot,
        e2e=e2e,
        max_tbt=max_tbt,
    )


def _thresholds(
    ttft_s: float | None, tpot_s: float | None, max_tbt_s: float | None, e2e_s: float | None
) -> dict[str, float]:
    given = {"ttft_s": ttft_s, "tpot_s": tpot_s, "max_tbt_s": max_tbt_s, "e2e_s": e2e_s}
    return {k: float(v) for k, v in given.items() if v is not None}


def _value_met(m: RequestMetrics, name: str, limit: float) -> BoolArray:
    """Whether each request's value is within ``limit``, status aside."""
    if name == "ttft_s":
        return np.asarray(m.ttft <= limit)
    if name == "e2e_s":
        return np.asarray(m.e2e <= limit)
    if name == "tpot_s":
        return np.asarray(~(m.tpot > limit))  # undefined (NaN) meets
    gap = np.where(np.isnan(m.max_tbt), m.tpot, m.max_tbt)  # unknown: its lower bound
    return np.asarray(~(gap > limit))


def _missed_before_abort(m: RequestMetrics, limits: Mapping[str, float]) -> BoolArray:
    """For aborted requests: a threshold already exceeded when the client left."""
    missed = np.zeros(len(m), dtype=bool)
    waited = m.end - m.arrival
    for name, limit in limits.items():
        if name == "ttft_s":
            so_far = np.where(np.isnan(m.first_token), waited, m.ttft)
            missed |= so_far > limit
        elif name == "e2e_s":
            missed |= waited > limit
        else:
            missed |= ~_value_met(m, name, limit)
    return missed


def meets(
    metrics: RequestMetrics,
    ttft_s: float | None = None,
    tpot_s: float | None = None,
    max_tbt_s: float | None = None,
    e2e_s: float | None = None,
) -> tuple[BoolArray, dict[str, BoolArray]]:
    """``(joint, per_threshold)``: whether each request met every threshold set, and each
    one (keys of :data:`THRESHOLDS` that were set). Requests not ``ok`` are False
    everywhere; count only :func:`judged` requests in a total.

    >>> m = request_metrics(arrival=[0.0], first_token=[0.4], end=[9.0], output_tokens=[2],
    ...                     max_tbt_s=[8.6])
    >>> joint, per = meets(m, ttft_s=0.5, max_tbt_s=1.0)
    >>> bool(joint[0]), sorted(per), bool(per["ttft_s"][0])
    (False, ['max_tbt_s', 'ttft_s'], True)
    """
    limits = _thresholds(ttft_s, tpot_s, max_tbt_s, e2e_s)
    ok = metrics.status == OK
    per = {name: ok & _value_met(metrics, name, limit) for name, limit in limits.items()}
    joint = ok.copy()
    for met in per.values():
        joint &= met
    return joint, per


def judged(
    metrics: RequestMetrics,
    ttft_s: float | None = None,
    tpot_s: float | None = None,
    max_tbt_s: float | None = None,
    e2e_s: float | None = None,
) -> BoolArray:
    """The requests that count in an SLO's total: all but the ``aborted_by_client`` ones that
    had met every threshold so far when the client left.

    >>> m = request_metrics(arrival=[0.0, 0.0], end=[0.3, 2.0],
    ...                     status=["aborted_by_client"] * 2)
    >>> judged(m, ttft_s=1.0).tolist()     # left after 0.3 s: excluded; after 2 s: a miss
    [False, True]
    """
    limits = _thresholds(ttft_s, tpot_s, max_tbt_s, e2e_s)
    aborted = metrics.status == ABORTED
    return np.asarray(~aborted | _missed_before_abort(metrics, limits))


def attainment(
    metrics: RequestMetrics,
    ttft_s: float | None = None,
    tpot_s: float | None = None,
    max_tbt_s: float | None = None,
    e2e_s: float | None = None,
) -> float | None:
    """The fraction of judged requests that met every threshold; None when none is judged."""
    joint, _ = meets(metrics, ttft_s, tpot_s, max_tbt_s, e2e_s)
    counted = judged(metrics, ttft_s, tpot_s, max_tbt_s, e2e_s)
    total = int(counted.sum())
    return float(joint[counted].sum() / total) if total else None


class Goodput(NamedTuple):
    requests_per_s: float
    tokens_per_s: float
    good: int  # requests that ended in the range and met the SLO
    seconds: float


def goodput(
    metrics: RequestMetrics, joint: npt.ArrayLike, *, since: float, until: float
) -> Goodput:
    """DistServe goodput over ``[since, until)``: requests (and their output tokens) per
    second that ended in the range and met every threshold (``joint`` from :func:`meets`)."""
    seconds = float(until) - float(since)
    if seconds <= 0:
        raise ValueError("until must be after since")
    good_mask = np.asarray(joint, dtype=bool) & (metrics.end >= since) & (metrics.end < until)
    good = int(good_mask.sum())
    tokens = float(np.nansum(metrics.output_tokens[good_mask]))
    return Goodput(good / seconds, tokens / seconds, good, seconds)


def percentiles(
    metrics: RequestMetrics,
    q: Iterable[float] = (50, 90, 95, 99),
    *,
    ok_only: bool = True,
) -> dict[str, dict[str, float | None]]:
    """Percentiles of TTFT, TPOT, E2E and max TBT over the requests where each is defined
    (only ``ok`` ones by default, as vLLM's benchmark reports successful requests):
    ``{"ttft": {"p50": …, "p99": …}, …}``; None where no request has the value.

    >>> m = request_metrics(arrival=[0, 0, 0, 0], first_token=[0.1, 0.2, 0.3, 0.4],
    ...                     end=[1, 1, 1, 1], output_tokens=[1, 1, 1, 1])
    >>> percentiles(m, q=[50])["ttft"], percentiles(m, q=[50])["tpot"]
    ({'p50': 0.25}, {'p50': None})
    """
    qs = [float(x) for x in q]
    keep = metrics.status == OK if ok_only else np.ones(len(metrics), dtype=bool)
    out: dict[str, dict[str, float | None]] = {}
    for name in ("ttft", "tpot", "e2e", "max_tbt"):
        values = getattr(metrics, name)[keep]
        values = values[np.isfinite(values)]
        labels = [f"p{x:g}" for x in qs]
        if values.size == 0:
            out[name] = dict.fromkeys(labels)
        else:
            pct = np.percentile(values, qs)
            out[name] = {label: float(v) for label, v in zip(labels, pct, strict=True)}
    return out

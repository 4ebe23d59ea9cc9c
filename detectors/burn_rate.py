"""Multiwindow, multi-burn-rate SLO alerts (Google SRE workbook, ch. 5 "Alerting on SLOs").

    >>> import numpy as np
    >>> total = np.full(4320, 100.0)                 # 3 days of minutes, 100 requests each
    >>> good = total.copy()
    >>> good[-90:] = 70.0                            # 30% bad for the last 90 minutes
    >>> [(r["tier"], r["firing"]) for r in burn_rates(total, good, 0.99, windows_for(30 * 86400))]
    [('page-fast', True), ('page-slow', True), ('ticket', False)]
    >>> f = evaluate(SloSeries(slo_id=7, name="chat", objective=0.99, period_s=30 * 86400,
    ...                        total=total, good=good), minutes=np.arange(4320))
    >>> f.key, f.severity, f.active, f.first_step
    ('slo_burn:7', 'critical', True, 4258)

**Burn rate** over a window = ``(1 − good/total) / (1 − objective)``: how many times faster
than "exactly on budget" the error budget is being spent. Undefined (never firing) when the
window holds no request. A tier **fires** when the burn rates over both its long and its
short window exceed its factor; the long window says the burn is significant, the short one
that it is still going on, so an alert stops as soon as the short window recovers.

**Tiers** for a 30-day period (the workbook's table; factor × long window / period = the
share of the budget spent when it fires):

==========  ========  ======  ======  ======  =============
tier        severity  long    short   factor  budget spent
==========  ========  ======  ======  ======  =============
page-fast   critical  1 h     5 m     14.4    2 %
page-slow   critical  6 h     30 m    6       5 %
ticket      warning   3 d     6 h     1       10 %
==========  ========  ======  ======  ======  =============

**Other periods** (:func:`windows_for`): the windows scale in proportion to the period and
the factors stay, so each tier still fires at the same share of the budget. This is Pyrra's
rule (``Windows(sloWindow)`` in pyrra-dev/pyrra ``slo/rules.go``: every window is a fixed
fraction of the SLO window — 1 h and 5 m for 28 days — with constant factors 14, 7, 2, 1),
applied to the workbook's 30-day table and rounded to whole minutes as Pyrra does. Sloth
does the reverse (slok/sloth ``internal/alert/window.go``, ``windows/google-28d.yaml``): it
keeps the windows of a per-period catalogue (28 and 30 days) and recomputes each factor as
``budget % × period / long window`` (13.44, 5.6 and 0.93 at 28 days). Both hold the budget
share constant; scaling works for any period. For 28 days this gives 56 m / 5 m at 14.4,
5 h 36 m / 28 m at 6, and 2 d 19 h 12 m / 5 h 36 m at 1.

**The detector** (``burn_rate``, kind ``slo_burn``) evaluates every minute of the window with
cumulative sums (all tiers, all minutes, in O(M)); windows that reach back before the first
minute use the minutes there are. One finding per SLO, key ``slo_burn:<slo_id>``, while any
tier fires at the last minute: ``critical`` when a page tier fires, else ``warning`` (the
severity follows the tier as it changes). When none fires any more, the latest episode is
reported with ``active=False`` while it is still in the window. ``first_step``/``last_step``
are epoch *minutes* (first and last minute the episode fired), so the backend tells
episodes apart and does not reopen one it has on record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from detectors.finding import Finding, Severity
from detectors.registry import register
from detectors.window import SloSeries, Window

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

__all__ = [
    "BASE_PERIOD_S",
    "BASE_TIERS",
    "Tier",
    "burn_rates",
    "evaluate",
    "window_sums",
    "windows_for",
]


@dataclass(frozen=True)
class Tier:
    """One alerting tier: fires when both windows burn faster than ``factor``."""

    name: str
    severity: Severity
    long_s: float
    short_s: float
    factor: float

    @property
    def long_minutes(self) -> int:
        return max(1, round(self.long_s / 60))

    @property
    def short_minutes(self) -> int:
        return max(1, round(self.short_s / 60))


BASE_PERIOD_S = 30 * 86400.0
BASE_TIERS = (
    Tier("page-fast", "critical", 3600.0, 300.0, 14.4),
    Tier("page-slow", "critical", 6 * 3600.0, 1800.0, 6.0),
    Tier("ticket", "warning", 3 * 86400.0, 6 * 3600.0, 1.0),
)


def windows_for(period_s: float) -> tuple[Tier, ...]:
    """The tiers for an SLO period: windows scaled by ``period_s / 30 days`` and rounded to
    whole minutes (at least one), factors unchanged.

    >>> [(t.name, t.long_minutes, t.short_minutes, t.factor) for t in windows_for(28 * 86400)]
    [('page-fast', 56, 5, 14.4), ('page-slow', 336, 28, 6.0), ('ticket', 4032, 336, 1.0)]
    """
    if not period_s > 0:
        raise ValueError("period_s must be > 0")
    scale = period_s / BASE_PERIOD_S
    out = []
    for t in BASE_TIERS:
        long_m = max(1, round(t.long_s * scale / 60))
        short_m = max(1, round(t.short_s * scale / 60))
        out.append(Tier(t.name, t.severity, 60.0 * long_m, 60.0 * short_m, t.factor))
    return tuple(out)


def window_sums(x: npt.ArrayLike, minutes: int) -> FloatArray:
    """``out[j]`` = the sum of ``x`` over the ``minutes`` entries ending at ``j`` (fewer at
    the start), for every ``j``, from one cumulative sum.

    >>> window_sums([1, 2, 3, 4], 2).tolist()
    [1.0, 3.0, 5.0, 7.0]
    """
    arr = np.asarray(x, dtype=np.float64).reshape(-1)
    cs = np.concatenate(([0.0], np.cumsum(arr)))
    j = np.arange(arr.size)
    lo = np.maximum(j + 1 - int(minutes), 0)
    return np.asarray(cs[j + 1] - cs[lo], dtype=np.float64)


def _burn(total: FloatArray, good: FloatArray, objective: float) -> FloatArray:
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = (1.0 - good / total) / (1.0 - objective)
    return np.asarray(np.where(total > 0, rate, np.nan), dtype=np.float64)


@dataclass(frozen=True)
class _TierSeries:
    tier: Tier
    long_total: FloatArray
    long_good: FloatArray
    short_total: FloatArray
    short_good: FloatArray
    long_burn: FloatArray
    short_burn: FloatArray
    firing: BoolArray


def _series(
    total: FloatArray, good: FloatArray, objective: float, tiers: Sequence[Tier]
) -> list[_TierSeries]:
    if not 0 < objective < 1:
        raise ValueError("objective must be between 0 and 1, exclusive")
    out = []
    for t in tiers:
        lt, lg = window_sums(total, t.long_minutes), window_sums(good, t.long_minutes)
        st, sg = window_sums(total, t.short_minutes), window_sums(good, t.short_minutes)
        lb, sb = _burn(lt, lg, objective), _burn(st, sg, objective)
        firing = np.asarray((lb > t.factor) & (sb > t.factor))  # NaN compares False
        out.append(_TierSeries(t, lt, lg, st, sg, lb, sb, firing))
    return out


def _num(x: float) -> float | None:
    return None if not np.isfinite(x) else float(f"{x:.4g}")


def _tier_evidence(s: _TierSeries, j: int) -> dict[str, Any]:
    return {
        "tier": s.tier.name,
        "severity": s.tier.severity,
        "long_window_s": s.tier.long_s,
        "short_window_s": s.tier.short_s,
        "factor": s.tier.factor,
        "long_burn_rate": _num(s.long_burn[j]),
        "short_burn_rate": _num(s.short_burn[j]),
        "long_total": float(s.long_total[j]),
        "long_bad": float(s.long_total[j] - s.long_good[j]),
        "short_total": float(s.short_total[j]),
        "short_bad": float(s.short_total[j] - s.short_good[j]),
        "firing": bool(s.firing[j]),
    }


def burn_rates(
    total: npt.ArrayLike, good: npt.ArrayLike, objective: float, tiers: Sequence[Tier]
) -> list[dict[str, Any]]:
    """Each tier's burn rates over its windows ending at the last minute, its counts, and
    whether it fires (JSON-ready; a burn rate over an empty window is None)."""
    t = np.asarray(total, dtype=np.float64).reshape(-1)
    g = np.asarray(good, dtype=np.float64).reshape(-1)
    if t.size != g.size:
        raise ValueError("total and good must have the same length")
    if t.size == 0:
        t, g = np.zeros(1), np.zeros(1)
    return [_tier_evidence(s, t.size - 1) for s in _series(t, g, objective, tiers)]


def _minutes_label(minutes: float) -> str:
    m = round(minutes)
    d, rest = divmod(m, 1440)
    h, mm = divmod(rest, 60)
    parts = [f"{d}d" if d else "", f"{h}h" if h else "", f"{mm}m" if mm else ""]
    return "".join(parts) or "0m"


def evaluate(
    slo: SloSeries, minutes: npt.ArrayLike, tiers: Sequence[Tier] | None = None
) -> Finding | None:
    """The ``slo_burn`` finding for one SLO over its per-minute counts (``minutes``: the epoch
    minute of each column), or None when no tier fired in the window."""
    mins = np.asarray(minutes, dtype=np.int64).reshape(-1)
    total = np.asarray(slo.total, dtype=np.float64).reshape(-1)
    good = np.asarray(slo.good, dtype=np.float64).reshape(-1)
    if total.size != mins.size or good.size != mins.size:
        raise ValueError(f"SLO {slo.slo_id}: counts and minutes differ in length")
    if mins.size == 0:
        return None
    series = _series(total, good, slo.objective, tiers or windows_for(slo.period_s))
    fired = np.zeros(mins.size, dtype=bool)
    for s in series:
        fired |= s.firing
    if not fired.any():
        return None
    last = int(np.flatnonzero(fired)[-1])
    before = np.flatnonzero(~fired[: last + 1])
    onset = int(before[-1]) + 1 if before.size else 0
    # The last column is the current minute, still filling: a tier that fired over the
    # previous (complete) minute keeps the alert active through it, so a nearly empty
    # current minute does not resolve the incident only for the next one to re-open it.
    active = last >= mins.size - 2

    at = [s for s in series if s.firing[last]]
    worst = max(at, key=lambda s: (s.tier.severity == "critical", s.tier.factor))
    severity: Severity = "critical" if any(s.tier.severity == "critical" for s in at) else "warning"
    sustained = max(min(s.long_burn[last], s.short_burn[last]) for s in at)

    if slo.period_total is not None and slo.period_good is not None and slo.period_total > 0:
        bad, judged, scope = slo.period_total - slo.period_good, slo.period_total, "period"
    else:
        bad, judged, scope = float(np.sum(total - good)), float(np.sum(total)), "window"
    consumed = (bad / judged) / (1.0 - slo.objective) if judged > 0 else float("nan")
    remaining = float(np.clip(1.0 - consumed, 0.0, 1.0)) if np.isfinite(consumed) else None

    j = mins.size - 1
    evidence: dict[str, Any] = {
        "slo_id": slo.slo_id,
        "slo_name": slo.name,
        "objective": slo.objective,
        "period_s": slo.period_s,
        "tier": worst.tier.name,
        "burn_rate": _num(sustained),
        "tiers": [_tier_evidence(s, j) for s in series],
        "error_budget_remaining": None if remaining is None else round(remaining, 4),
        "error_budget_consumed": _num(consumed),
        "budget_scope": scope,
        "since_minute": int(mins[onset]),
        "last_minute": int(mins[last]),
        "minutes_firing": last - onset + 1,
    }
    if not active:
        evidence["fired_tiers"] = [_tier_evidence(s, last) for s in at]
    short = _minutes_label(worst.tier.short_s / 60)
    long = _minutes_label(worst.tier.long_s / 60)
    summary = (
        f"SLO {slo.name!r} burns its error budget {sustained:.3g}x too fast "
        f"({worst.tier.name}: over {worst.tier.factor:g}x in both the {long} and {short} "
        f"windows)"
    )
    if remaining is not None:
        summary += f"; {100 * remaining:.0f}% of the budget left"
    if not active:
        summary += f"; the {short} window has recovered"
    return Finding(
        kind="slo_burn",
        severity=severity,
        ranks=(),
        first_step=int(mins[onset]),
        score=round(float(sustained), 3),
        summary=summary,
        key=f"slo_burn:{slo.slo_id}",
        evidence=evidence,
        active=active,
        last_step=int(mins[last]),
    )


@register("burn_rate", kinds={"slo_burn"}, needs={"serving"})
def _detect(window: Window) -> list[Finding]:
    w = window.serving
    assert w is not None
    found = (evaluate(slo, w.minutes) for slo in w.slos)
    return [f for f in found if f is not None]

"""A serving job's SLOs as the serving page and the jobs list show them: each SLO with its
status (``backend.slos.service.status``), and one headline that says whether they are met
now.

    statuses = slo_statuses(session=s, job="chat", now=time.time())
    slo_headline(statuses)
    # {"level": "critical", "short": "SLO violated",
    #  "text": "SLO violated now: interactive (burning its error budget 20.0× over 56m/5m;
    #           page-fast at 14.4×).",
    #  "worst": {"name": "interactive", "attainment": 0.8, "objective": 0.99}}

*Met now* is the burn-rate alerts' view (``detectors.burn_rate``: for a 30-day period 1h/5m
at 14.4×, 6h/30m at 6×, 3d/6h at 1×, scaled to the SLO's period): a firing critical (page)
alert means violated, a firing warning (ticket) alert at risk; otherwise the SLOs
are met now, and the headline adds whether one is below its objective over its period.
A status that cannot be computed is shown as unavailable, never raised: the page stays up.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.orm import Session

from backend.slos import service
from backend.slos.models import Slo

log = logging.getLogger(__name__)

# Headline levels, from nothing to say to the worst.
LEVELS = ("none", "ok", "unknown", "warning", "critical")
UNAVAILABLE: dict[str, Any] = {
    "requests": None,
    "attainment": None,
    "attainment_by_threshold": {},
    "goodput_rps": None,
    "goodput_tokens_per_s": None,
    "smooth_goodput": None,
    "error_budget_remaining": None,
    "burn_rates": [],
    "since": None,
    "until": None,
}


def slo_statuses(*, session: Session, job: str, now: float) -> list[dict[str, Any]]:
    """Every SLO of ``job`` (by name) with its figures over its period up to ``now``;
    ``error`` says why the figures are missing, if they are."""
    out = []
    for slo in service.list_slos(session=session, job=job):
        row: dict[str, Any] = {c.key: getattr(slo, c.key) for c in Slo.__table__.columns}
        try:
            row.update(service.status(session=session, slo=slo, now=now), error=None)
        except Exception as exc:  # shown on the page, not raised: the page must stay up
            log.warning("SLO %s of job %r: status failed", slo.id, job, exc_info=True)
            row.update(UNAVAILABLE, error=f"status unavailable ({type(exc).__name__})")
        out.append(row)
    return out


def window_text(long_s: float, short_s: float) -> str:
    """``3600, 300`` → ``"1h/5m"``."""
    return f"{_duration(long_s)}/{_duration(short_s)}"


def _duration(seconds: float) -> str:
    """``20160`` → ``"5h36m"``, ``86400`` → ``"1d"``."""
    minutes = round(seconds / 60)
    if minutes == 0:
        return f"{seconds:g}s"
    days, rest = divmod(minutes, 1440)
    hours, mins = divmod(rest, 60)
    return "".join(f"{n}{unit}" for n, unit in ((days, "d"), (hours, "h"), (mins, "m")) if n)


def _pct(value: float) -> str:
    return f"{100 * value:.2f}".rstrip("0").rstrip(".") + "%"


def _critical(rate: dict[str, Any]) -> bool:
    severity = rate.get("severity")
    return severity == "critical" or (
        severity is None and str(rate.get("tier", "")).startswith("page")
    )


def _burning(firing: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """``name (burning … over 1h/5m; page at 14.4×)``, per SLO, its fastest firing window."""
    parts = []
    for name in dict.fromkeys(s["name"] for s, _ in firing):
        rates = [r for s, r in firing if s["name"] == name]
        r = max(rates, key=lambda r: r.get("long_burn_rate") or 0.0)
        window = window_text(r["long_window_s"], r["short_window_s"])
        burn = r.get("long_burn_rate")
        rate = f"{burn:.1f}×" if burn is not None else "fast"
        parts.append(
            f"{name} (burning its error budget {rate} over {window}; "
            f"{r['tier']} at {r['factor']:g}×)"
        )
    return ", ".join(parts)


def slo_headline(statuses: list[dict[str, Any]]) -> dict[str, Any]:
    """One line for the top of the page: ``level`` (one of ``LEVELS``), ``text``, a
    ``short`` form for the jobs list, and the SLO furthest below (or least above) its
    objective over the period (``worst``, ``None`` before any request was judged)."""
    known = [s for s in statuses if s.get("error") is None]
    judged = [s for s in known if s.get("attainment") is not None]
    worst = min(judged, key=lambda s: s["attainment"] - s["objective"], default=None)
    out: dict[str, Any] = {
        "worst": None
        if worst is None
        else {k: worst[k] for k in ("name", "attainment", "objective")}
    }
    if not statuses:
        return {**out, "level": "none", "short": "no SLOs", "text": "No SLOs defined."}
    firing = [(s, r) for s in known for r in s.get("burn_rates") or [] if r.get("firing")]
    pages = [(s, r) for s, r in firing if _critical(r)]
    missing = len(statuses) - len(known)
    tail = f" {missing} of {len(statuses)} SLO statuses unavailable." if missing else ""
    if pages:
        text = f"SLO violated now: {_burning(pages)}.{tail}"
        return {**out, "level": "critical", "short": "SLO violated", "text": text}
    if firing:
        text = f"SLO at risk: {_burning(firing)}.{tail}"
        return {**out, "level": "warning", "short": "SLO at risk", "text": text}
    if not known:
        return {**out, "level": "unknown", "short": "status unavailable", "text": tail.strip()}
    if not judged:
        text = f"No requests judged against the SLOs yet.{tail}"
        return {**out, "level": "none", "short": "no requests yet", "text": text}
    assert worst is not None
    vs = f"{worst['name']} {_pct(worst['attainment'])} vs objective {_pct(worst['objective'])}"
    if worst["attainment"] < worst["objective"]:
        text = f"SLOs met now, but below objective over the period: {vs}.{tail}"
        return {**out, "level": "warning", "short": "below objective", "text": text}
    n = len(known)
    text = f"{'All ' + str(n) + ' SLOs' if n > 1 else 'SLO'} met now (lowest: {vs}).{tail}"
    return {**out, "level": "ok", "short": "SLOs met", "text": text}

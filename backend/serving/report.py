"""What a replay measured, summed up: counts, TTFT and TPOT percentiles, throughput.

summary = summarize(run.outcomes, duration_s=run.finished)
console.print(summary_table(summary))
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from rich.table import Table

from backend.serving.replay import Outcome

QUANTILES = (50, 90, 99)


@dataclass(frozen=True)
class Summary:
    sent: int
    by_status: dict[str, int]
    duration_s: float
    output_tokens: int  # of the requests that completed
    ttft_s: dict[int, float | None]  # percentile → seconds
    tpot_s: dict[int, float | None]
    latency_s: dict[int, float | None]  # send → last byte
    lag_s: dict[int, float | None]  # how late requests went out (the concurrency cap)
    errors: list[str] = field(default_factory=list)  # a few examples

    @property
    def ok(self) -> int:
        return self.by_status.get("ok", 0)

    @property
    def failed(self) -> int:
        return self.sent - self.ok

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def requests_per_s(self) -> float:
        return self.ok / self.duration_s if self.duration_s > 0 else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "sent": self.sent,
            "ok": self.ok,
            "by_status": self.by_status,
            "duration_s": self.duration_s,
            "output_tokens": self.output_tokens,
            "tokens_per_s": self.tokens_per_s,
            "requests_per_s": self.requests_per_s,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "latency_s": self.latency_s,
            "lag_s": self.lag_s,
        }


def percentiles(values: Sequence[float]) -> dict[int, float | None]:
    if not values:
        return dict.fromkeys(QUANTILES)
    qs = np.percentile(np.asarray(values, dtype=float), QUANTILES)
    return {q: float(v) for q, v in zip(QUANTILES, qs, strict=True)}


def summarize(outcomes: Sequence[Outcome], duration_s: float | None = None) -> Summary:
    """``duration_s`` defaults to the span from the first send to the last end."""
    ok = [o for o in outcomes if o.status == "ok"]
    if duration_s is None:
        duration_s = (
            max(o.end_s for o in outcomes) - min(o.sent_s for o in outcomes) if outcomes else 0.0
        )
    return Summary(
        sent=len(outcomes),
        by_status=dict(Counter(o.status for o in outcomes)),
        duration_s=duration_s,
        output_tokens=sum(o.output_tokens for o in ok),
        ttft_s=percentiles([t for o in ok if (t := o.ttft_s) is not None]),
        tpot_s=percentiles([t for o in ok if (t := o.tpot_s) is not None]),
        latency_s=percentiles([o.end_s - o.sent_s for o in ok]),
        lag_s=percentiles([o.lag_s for o in outcomes]),
        errors=[o.error for o in outcomes if o.error][:3],
    )


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1000:,.1f} ms"


def summary_table(summary: Summary) -> Table:
    """Percentiles of TTFT, TPOT, latency and send lag; then counts and throughput."""
    table = Table(show_header=True, min_width=60)
    table.add_column("")
    for q in QUANTILES:
        table.add_column(f"p{q}", justify="right")
    for name, values in (
        ("TTFT", summary.ttft_s),
        ("TPOT", summary.tpot_s),
        ("latency", summary.latency_s),
        ("send lag", summary.lag_s),
    ):
        table.add_row(name, *(_ms(values[q]) for q in QUANTILES))
    table.add_section()
    failed = ", ".join(f"{k} {v}" for k, v in sorted(summary.by_status.items()) if k != "ok")
    table.add_row("requests", f"sent {summary.sent}", f"ok {summary.ok}", failed or "failed 0")
    table.add_row(
        "throughput",
        f"{summary.tokens_per_s:,.0f} tok/s",
        f"{summary.requests_per_s:.2f} req/s",
        f"over {summary.duration_s:.1f} s",
    )
    return table

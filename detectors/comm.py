"""Communication anomalies: slow collectives, localized to the rank that all slow groups share.

    families = families_from_records(rank, step, group, op, nbytes, duration_s, members=groups)
    findings = detect_comm(families, steps=steps)

Input: a :class:`CollectiveFamily` per (group kind, op), e.g. every tensor-parallel
``all_reduce``: the family's G groups (``tp-0`` … ``tp-2047``), their member ranks
``(G, M)``, the bytes each group moved per step ``(G, S)`` and each member's seconds inside the
collective per step ``(G, M, S)``. Records are aggregated per (rank, step, group, op) — sums
over the calls in a step, as the collector's ``count`` field implies. Dense arrays keep the
detector free of group-by work: every reduction is along an axis. :func:`families_from_records`
builds them from flat, parallel per-record arrays (what a SQL query returns).

Method, per family:

1. **Transfer time.** A member's time in a collective includes waiting for the members that
   arrive late. The member that arrives last does not wait, so the minimum over members is the
   transfer time: a compute straggler (the straggler detector's business) leaves it unchanged,
   a slow link or NIC stretches it for everyone. Bandwidth per group and step is
   ``bytes / min_member_duration`` (algorithm bandwidth).
2. **Reference.** With at least ``min_peers`` groups, the per-step median bandwidth of the
   family's groups (of at most ``max_peer_sample``, evenly spaced: peers run the same op on
   the same message sizes over the same kind of links, so they should match); with exactly
   two groups, the other group's bandwidth at the same step. Families of one group are not
   judged (no peers, no member to single out: the slowdown detector covers the job).
3. **Slow group.** Bandwidth below ``1 - min_drop`` times the reference on at least
   ``min_frac`` of some ``min_steps`` consecutive steps (blips do not count). ``active`` when
   that also holds for the last ``min_steps`` steps.
4. **Family-wide drop.** The family's median bandwidth against its own first
   ``baseline_steps`` (peers cannot see a drop they all share): one finding with no ranks.

Localization across families: a rank's count is the number of slow groups it belongs to. In
each slow group the suspects are the members with the highest count; when that count is at
least 2 (rank 3 is in both slow ``tp-0`` and slow ``dp-3``) the finding names those ranks,
key ``comm_anomaly:rank:3``. Counts are taken first among the groups that turned slow within
``onset_tolerance`` steps of each other (one fault), then among all slow groups, so two
faults at different times are not blamed on the ranks where their groups cross. A slow group
that no other slow group explains gives a finding keyed ``comm_anomaly:group:tp-0``, naming
its members when there are at most ``max_group_suspects`` (a pipeline pair) and its family
has other groups, else no ranks: naming 2,048 data-parallel ranks, or every rank of a job
whose only group is the world, would not help.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from detectors.comm_families import CollectiveFamily, families_from_records, group_kind
from detectors.finding import Finding
from detectors.registry import register
from detectors.window import Window

__all__ = [
    "CollectiveFamily",
    "CommConfig",
    "detect_comm",
    "families_from_records",
    "group_kind",
]

_GB = 1e9


@dataclass(frozen=True)
class CommConfig:
    """Tuning for :func:`detect_comm`."""

    min_drop: float = 0.3
    """A group is slow below ``(1 - min_drop)`` times its reference bandwidth (0.3: 30% slower)."""
    self_min_drop: float = 0.6
    """Without peers to compare with, a group is judged against its own early history, which
    also moves with host load (seen: 2x swings of gloo bandwidth on a busy CPU host), so the
    drop must be larger (0.6: below 40% of its baseline). Also used for family-wide drops."""
    min_steps: int = 10
    """Length of the run of steps that must be mostly slow."""
    min_frac: float = 0.8
    """Fraction of a ``min_steps`` run that must be slow."""
    min_peers: int = 2
    """Families with at least this many groups compare each group against its peers (with
    exactly two, against the other one); smaller families against their own history."""
    baseline_steps: int = 20
    """Steps at the start of the window that give a group (or family) its own baseline."""
    max_group_suspects: int = 8
    """An unlocalized slow group names its members only if it has at most this many."""
    onset_tolerance: int = 5
    """Slow groups whose onsets are at most this many steps apart are one fault."""
    max_peer_sample: int = 256
    """The peer median per step uses at most this many evenly spaced groups."""


def detect_comm(
    families: Sequence[CollectiveFamily],
    *,
    steps: npt.ArrayLike | None = None,
    config: CommConfig | None = None,
) -> list[Finding]:
    """Find slow collective groups and the ranks they have in common.

    families: one :class:`CollectiveFamily` per (group kind, op), all over the same S steps.
    steps: ``(S,)`` int, the training step of each column; default ``0..S-1``.
    """
    cfg = config or CommConfig()
    if not families:
        return []
    n_steps = families[0].duration_s.shape[2]
    if any(f.duration_s.shape[2] != n_steps for f in families):
        raise ValueError("all families must cover the same steps")
    step_ids = (
        np.arange(n_steps, dtype=np.int64)
        if steps is None
        else np.asarray(steps, dtype=np.int64).reshape(-1)
    )
    if step_ids.size != n_steps:
        raise ValueError(f"steps has {step_ids.size} entries for {n_steps} columns")
    if n_steps < cfg.min_steps:
        return []

    findings: list[Finding] = []
    slow: list[_SlowGroup] = []
    # A family of one group (the world group of a small job) has no peers and no member
    # to single out: its slowdowns are the job's, which the slowdown detector reports
    # (attributed to communication). Judged against its own history on a shared host, it
    # would mostly report noise.
    for fam in (f for f in families if f.duration_s.shape[0] >= 2):
        fam_slow, fam_wide = _scan_family(fam, step_ids, cfg)
        slow.extend(fam_slow)
        if fam_wide is not None:
            findings.append(fam_wide)
    findings.extend(_localize(slow, cfg))
    return findings


@dataclass(frozen=True)
class _SlowGroup:
    family: str
    group: str
    members: NDArray[np.int64]
    onset: int  # training steps
    last: int
    active: bool
    bandwidth: float  # bytes/s, median over its slow steps
    reference: float  # bytes/s, the reference over the same steps
    baseline: float | None  # bytes/s, its own median before the onset (None: no history)
    family_groups: int  # how many groups its family has


def _scan_family(
    fam: CollectiveFamily, step_ids: NDArray[np.int64], cfg: CommConfig
) -> tuple[list[_SlowGroup], Finding | None]:
    n_groups = fam.duration_s.shape[0]
    if n_groups == 0:
        return [], None
    transfer = np.fmin.reduce(fam.duration_s, axis=1)  # (G, S); NaN only where no member reported
    with np.errstate(divide="ignore", invalid="ignore"):
        bw = np.where((transfer > 0) & (fam.nbytes > 0), fam.nbytes / transfer, np.nan)
    peers = n_groups >= cfg.min_peers
    sample = np.unique(np.linspace(0, n_groups - 1, min(n_groups, cfg.max_peer_sample)).astype(int))
    family_bw = _nanmedian_cols(bw[sample]) if peers else None
    if family_bw is not None and n_groups == 2:
        # The median of two is their mean, which a slow group drags down with it: compare
        # each group with the other one instead (both slow together is a family-wide drop).
        reference = bw[::-1]
    elif family_bw is not None:
        reference = np.broadcast_to(family_bw, bw.shape)
    else:
        reference = np.broadcast_to(_nanmedian_rows(bw[:, : cfg.baseline_steps])[:, None], bw.shape)
    drop = cfg.min_drop if peers else cfg.self_min_drop
    with np.errstate(invalid="ignore"):
        low = bw < (1.0 - drop) * reference  # NaN compares False

    found: list[_SlowGroup] = []
    sustained, first_window = _sustained(low, cfg)
    for g in np.flatnonzero(sustained):
        cols = np.flatnonzero(low[g])
        onset = int(cols[np.searchsorted(cols, first_window[g])])
        last = int(cols[-1])
        span = cols[cols >= onset]
        history = bw[g, :onset]
        history = history[np.isfinite(history)]
        found.append(
            _SlowGroup(
                family=fam.name,
                group=fam.group_names[g],
                members=fam.members[g][fam.members[g] >= 0],
                onset=int(step_ids[onset]),
                last=int(step_ids[last]),
                active=bool(_recent_low(low[g], cfg)),
                bandwidth=float(np.median(bw[g, span])),
                reference=float(np.nanmedian(reference[g, span])),
                baseline=float(np.median(history)) if history.size >= cfg.min_steps else None,
                family_groups=n_groups,
            )
        )

    wide = None
    if family_bw is not None:
        wide = _family_drop(fam, family_bw, step_ids, cfg)
    return found, wide


def _sustained(
    low: NDArray[np.bool_], cfg: CommConfig
) -> tuple[NDArray[np.bool_], NDArray[np.intp]]:
    """Per row: whether some ``min_steps`` window is ``min_frac`` low, and the first such."""
    w = cfg.min_steps
    need = int(np.ceil(cfg.min_frac * w))
    run = np.zeros((low.shape[0], low.shape[1] + 1), dtype=np.int32)
    np.cumsum(low, axis=1, out=run[:, 1:])
    hits = (run[:, w:] - run[:, :-w]) >= need  # (G, S - w + 1)
    return np.asarray(hits.any(axis=1)), np.asarray(np.argmax(hits, axis=1), dtype=np.intp)


def _recent_low(low: NDArray[np.bool_], cfg: CommConfig) -> bool:
    return bool(low[..., -cfg.min_steps :].sum(axis=-1) >= np.ceil(cfg.min_frac * cfg.min_steps))


def _family_drop(
    fam: CollectiveFamily,
    family_bw: NDArray[np.float64],
    step_ids: NDArray[np.int64],
    cfg: CommConfig,
) -> Finding | None:
    base_cols = family_bw[: cfg.baseline_steps]
    base_cols = base_cols[np.isfinite(base_cols)]
    if base_cols.size == 0:
        return None
    baseline = float(np.median(base_cols))
    with np.errstate(invalid="ignore"):
        low = family_bw < (1.0 - cfg.self_min_drop) * baseline
    sustained, first_window = _sustained(low[None, :], cfg)
    if not sustained[0]:
        return None
    cols = np.flatnonzero(low)
    onset = int(cols[np.searchsorted(cols, first_window[0])])
    span = cols[cols >= onset]
    now = float(np.median(family_bw[span]))
    active = _recent_low(low, cfg)
    onset_step, last_step = int(step_ids[onset]), int(step_ids[cols[-1]])
    summary = (
        f"{fam.op} bandwidth of all {len(fam.group_names)} {fam.kind} groups fell to "
        f"{now / _GB:.3g} GB/s from {baseline / _GB:.3g} GB/s at step {onset_step}"
    )
    if not active:
        summary += f"; recovered after step {last_step}"
    return Finding(
        kind="comm_anomaly",
        severity="warning",
        ranks=(),
        first_step=onset_step,
        score=round(baseline / now, 2),
        summary=summary,
        key=f"comm_anomaly:family:{fam.name}",
        evidence={
            "family": fam.name,
            "groups": len(fam.group_names),
            "bandwidth_gbps": _round(now / _GB),
            "baseline_gbps": _round(baseline / _GB),
            "drop_pct": round(100 * (1 - now / baseline), 1),
        },
        active=active,
        last_step=last_step,
    )


def _localize(slow: list[_SlowGroup], cfg: CommConfig) -> list[Finding]:
    if not slow:
        return []
    size = max(int(s.members.max(initial=0)) for s in slow) + 1
    everywhere = _member_counts(slow, size)
    by_suspects: dict[tuple[int, ...], list[_SlowGroup]] = defaultdict(list)
    unexplained: dict[str, list[_SlowGroup]] = defaultdict(list)
    # Groups that turned slow together are one fault: count within such a cluster first (two
    # faults, rank 19 at step 100 and rank 53 at step 120, would otherwise also implicate
    # ranks 21 and 51, which share one slow group with each), then across all slow groups.
    for cluster in _onset_clusters(slow, cfg.onset_tolerance):
        together = _member_counts(cluster, size)
        for s in cluster:
            suspects = _top_members(s, together) or _top_members(s, everywhere)
            if suspects:
                by_suspects[suspects].append(s)
            else:
                unexplained[s.group].append(s)
    findings = [_rank_finding(ranks, groups) for ranks, groups in by_suspects.items()]
    findings.extend(_group_finding(groups, cfg) for groups in unexplained.values())
    return findings


def _member_counts(slow: list[_SlowGroup], size: int) -> NDArray[np.intp]:
    """How many distinct slow groups each rank is in (a group slow in two ops counts once)."""
    distinct = {s.group: s.members for s in slow}
    return np.bincount(np.concatenate(list(distinct.values())), minlength=size)


def _top_members(s: _SlowGroup, count: NDArray[np.intp]) -> tuple[int, ...]:
    """The members of ``s`` in the most slow groups, if that is at least two; else ``()``."""
    c = count[s.members]
    if c.size == 0 or c.max() < 2:
        return ()
    return tuple(int(r) for r in np.sort(s.members[c == c.max()]))


def _onset_clusters(slow: list[_SlowGroup], tolerance: int) -> list[list[_SlowGroup]]:
    ordered = sorted(slow, key=lambda s: s.onset)
    clusters = [[ordered[0]]]
    for s in ordered[1:]:
        if s.onset - clusters[-1][-1].onset <= tolerance:
            clusters[-1].append(s)
        else:
            clusters.append([s])
    return clusters


def _group_evidence(s: _SlowGroup) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "group": s.group,
        "family": s.family,
        "bandwidth_gbps": _round(s.bandwidth / _GB),
        "reference_gbps": _round(s.reference / _GB),
        "slower_x": round(s.reference / s.bandwidth, 2),
        "onset_step": s.onset,
        "active": s.active,
    }
    if s.baseline is not None:
        ev["own_baseline_gbps"] = _round(s.baseline / _GB)
    return ev


def _describe(s: _SlowGroup) -> str:
    op = s.family.split("/", 1)[1]
    return f"{s.group} ({op} {s.bandwidth / _GB:.3g} vs {s.reference / _GB:.3g} GB/s)"


def _rank_finding(ranks: tuple[int, ...], groups: list[_SlowGroup]) -> Finding:
    onset = min(s.onset for s in groups)
    active = any(s.active for s in groups)
    who = f"rank {ranks[0]} is" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))} are"
    summary = (
        f"{who} the common member of slow groups "
        f"{', '.join(_describe(s) for s in groups)} since step {onset}"
    )
    if not active:
        summary += f"; recovered after step {max(s.last for s in groups)}"
    return Finding(
        kind="comm_anomaly",
        severity="warning",
        ranks=ranks,
        first_step=onset,
        score=round(max(s.reference / s.bandwidth for s in groups), 2),
        summary=summary,
        key="comm_anomaly:rank:" + ",".join(map(str, ranks)),
        evidence={"slow_groups": [_group_evidence(s) for s in groups]},
        active=active,
        last_step=max(s.last for s in groups),
    )


def _group_finding(groups: list[_SlowGroup], cfg: CommConfig) -> Finding:
    """One slow group (possibly slow in several ops) that no other slow group explains."""
    first = groups[0]
    # A family of one group (e.g. the world group of a small job) is the whole job:
    # naming all its ranks would point at no one.
    named = first.members.size <= cfg.max_group_suspects and first.family_groups > 1
    ranks = tuple(int(r) for r in np.sort(first.members)) if named else ()
    onset = min(s.onset for s in groups)
    last = max(s.last for s in groups)
    active = any(s.active for s in groups)
    described = ", ".join(_describe(s) for s in groups)
    summary = f"slow group {described} since step {onset}; "
    summary += "no other slow group shares a member" if named else "cannot narrow it to a rank"
    if not active:
        summary += f"; recovered after step {last}"
    return Finding(
        kind="comm_anomaly",
        severity="warning",
        ranks=ranks,
        first_step=onset,
        score=round(max(s.reference / s.bandwidth for s in groups), 2),
        summary=summary,
        key=f"comm_anomaly:group:{first.group}",
        evidence={
            "slow_groups": [_group_evidence(s) for s in groups],
            "group_size": int(first.members.size),
        },
        active=active,
        last_step=last,
    )


# --- building families from flat records ----------------------------------------------------


def _nanmedian_cols(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """``(S,)`` median over groups of the finite values of a ``(G, S)`` array."""
    xt = np.ascontiguousarray(x.T)
    finite = np.isfinite(xt)
    if finite.all():
        return np.asarray(np.median(xt, axis=1), dtype=np.float64)
    empty = ~finite.any(axis=1)
    xt[empty] = 0.0  # keeps nanmedian quiet; set back to NaN below
    med = np.asarray(np.nanmedian(xt, axis=1), dtype=np.float64)
    med[empty] = np.nan
    return med


def _nanmedian_rows(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """``(G,)`` median over steps of the finite values of a ``(G, S)`` array."""
    return _nanmedian_cols(x.T)


def _round(value: float) -> float:
    return float(f"{value:.4g}")


@register("comm", kinds={"comm_anomaly"}, needs={"collectives"})
def _detect_window(window: Window) -> list[Finding]:
    c = window.collectives
    assert c is not None
    if c.rank.size == 0:
        return []
    families, steps = families_from_records(
        c.rank, c.step, c.group, c.op, c.nbytes, c.duration_s, members=c.members
    )
    return detect_comm(families, steps=steps)

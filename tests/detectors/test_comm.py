"""Collective bandwidth anomalies and their localization, on synthetic 2-D parallel jobs.

Layout: ranks ``r = dp_index * TP + tp_index``; tensor-parallel groups ``tp-i`` are blocks of
TP consecutive ranks, data-parallel groups ``dp-j`` are every TP-th rank from j. Rank 19 is in
``tp-2`` and ``dp-3`` (with TP = 8).
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from detectors.comm import (
    CollectiveFamily,
    CommConfig,
    detect_comm,
    families_from_records,
    group_kind,
)

TP, S = 8, 200
SPECS = {"tp": (64e6, 200e9), "dp": (256e6, 40e9)}  # bytes per step, link bandwidth


def layout(ranks: int) -> dict[str, np.ndarray]:
    blocks = np.arange(ranks).reshape(-1, TP)
    return {"tp": blocks, "dp": blocks.T.copy()}


def families(
    ranks: int = 64,
    *,
    seed: int = 0,
    slow: dict[str, tuple[int, int | None, float]] | None = None,
    slow_rank: int | None = None,
    onset: int = 100,
    end: int | None = None,
    factor: float = 4.0,
    straggler: int | None = None,
    ops: tuple[str, ...] = ("all_reduce",),
) -> list[CollectiveFamily]:
    """Families with jittered transfer times plus random waiting. ``slow_rank``: every group
    containing it transfers ``factor`` times slower in ``[onset, end)``. ``slow``: group name →
    (onset, end, factor). ``straggler``: a rank that computes slowly, so its peers wait for it
    while it waits for no one."""
    rng = np.random.default_rng(seed)
    out = []
    for kind, members in layout(ranks).items():
        n_bytes, bw = SPECS[kind]
        groups, size = members.shape
        transfer = n_bytes / bw
        for op in ops:
            dur = transfer * (1 + 0.05 * rng.standard_normal((groups, size, S)) ** 2)
            dur += rng.exponential(0.3 * transfer, (groups, size, S))  # waiting on peers
            names = tuple(f"{kind}-{i}" for i in range(groups))
            if slow_rank is not None:
                hit = np.flatnonzero((members == slow_rank).any(axis=1))
                dur[hit, :, onset:end] *= factor
            for name, (g_onset, g_end, g_factor) in (slow or {}).items():
                if name in names:
                    dur[names.index(name), :, g_onset:g_end] *= g_factor
            if straggler is not None:
                g = np.flatnonzero((members == straggler).any(axis=1))
                wait = np.where(members[g] == straggler, 0.0, 0.05)
                dur[g, :, onset:end] += wait[:, :, None]
            out.append(
                CollectiveFamily(
                    kind=kind,
                    op=op,
                    group_names=names,
                    members=members,
                    nbytes=np.full((groups, S), n_bytes),
                    duration_s=dur,
                )
            )
    return out


@pytest.mark.parametrize("seed", range(10))
def test_healthy_jobs_produce_nothing(seed: int) -> None:
    assert detect_comm(families(seed=seed)) == []


def test_slow_rank_is_the_member_common_to_the_slow_groups() -> None:
    (f,) = detect_comm(families(slow_rank=19), steps=np.arange(S) + 1000)

    assert (f.kind, f.severity, f.ranks, f.key) == (
        "comm_anomaly",
        "warning",
        (19,),
        "comm_anomaly:rank:19",
    )
    assert f.first_step == 1100 and f.active and f.last_step == 1199
    groups = {g["group"]: g for g in f.evidence["slow_groups"]}
    assert set(groups) == {"tp-2", "dp-3"}
    tp = groups["tp-2"]
    assert tp["slower_x"] == pytest.approx(4.0, rel=0.1)
    assert tp["reference_gbps"] == pytest.approx(tp["own_baseline_gbps"], rel=0.05)
    assert tp["bandwidth_gbps"] < 0.3 * tp["reference_gbps"]
    assert "rank 19" in f.summary and "\n" not in f.summary
    json.dumps(f.evidence, allow_nan=False)


def test_recovered_link_is_inactive() -> None:
    (f,) = detect_comm(families(slow_rank=19, end=150))
    assert f.ranks == (19,) and not f.active and f.last_step == 149


def test_compute_straggler_is_not_a_slow_link() -> None:
    """Peers wait 50 ms for rank 19 in every collective, but the last to arrive does not."""
    assert detect_comm(families(straggler=19)) == []


def test_single_slow_group_names_small_groups_only() -> None:
    (f,) = detect_comm(families(slow={"tp-5": (100, None, 3.0)}))
    assert f.key == "comm_anomaly:group:tp-5" and f.ranks == tuple(range(40, 48))

    (f,) = detect_comm(families(slow={"dp-1": (100, None, 3.0)}))
    assert f.key == "comm_anomaly:group:dp-1" and f.ranks == tuple(range(1, 64, 8))

    few = CommConfig(max_group_suspects=4)
    (f,) = detect_comm(families(slow={"dp-1": (100, None, 3.0)}), config=few)
    assert f.ranks == () and f.evidence["group_size"] == 8 and "cannot narrow" in f.summary


def test_two_independent_slow_ranks() -> None:
    slow = {"tp-2": (100, None, 4.0), "dp-3": (100, None, 4.0)}  # rank 19
    slow |= {"tp-6": (120, None, 3.0), "dp-5": (120, None, 3.0)}  # rank 53
    findings = detect_comm(families(slow=slow))
    assert sorted(f.ranks for f in findings) == [(19,), (53,)]
    assert {f.first_step for f in findings} == {100, 120}


def test_same_group_slow_in_two_ops_does_not_accuse_every_member() -> None:
    fams = families(slow={"tp-2": (100, None, 4.0)}, ops=("all_reduce", "all_gather"))
    (f,) = detect_comm(fams)
    assert f.key == "comm_anomaly:group:tp-2" and f.ranks == tuple(range(16, 24))
    assert {g["family"] for g in f.evidence["slow_groups"]} == {"tp/all_reduce", "tp/all_gather"}


def test_family_wide_drop_is_reported_without_ranks() -> None:
    # e.g. NVLink throttled everywhere; judged against history, so it must be a big drop
    slow = {f"tp-{i}": (100, None, 3.0) for i in range(8)}
    (f,) = detect_comm(families(slow=slow))
    assert f.key == "comm_anomaly:family:tp/all_reduce" and f.ranks == ()
    assert f.first_step == 100 and f.evidence["drop_pct"] == pytest.approx(67, abs=5)


def test_two_groups_compare_with_each_other() -> None:
    """16 ranks: two tp groups; each is held to the other, so a 1.6x slow group is found."""
    tp_only = [f for f in families(ranks=16) if f.kind == "tp"]
    assert len(tp_only[0].group_names) == 2
    assert detect_comm(tp_only) == []
    slow_tp = [f for f in families(ranks=16, slow={"tp-1": (100, None, 1.6)}) if f.kind == "tp"]
    (f,) = detect_comm(slow_tp)
    assert f.key == "comm_anomaly:group:tp-1" and f.first_step == 100
    assert f.ranks == tuple(range(8, 16))


def test_two_groups_slow_together_is_a_family_drop() -> None:
    both = {"tp-0": (100, None, 3.0), "tp-1": (100, None, 3.0)}
    tp_only = [f for f in families(ranks=16, slow=both) if f.kind == "tp"]
    (f,) = detect_comm(tp_only)
    assert f.key == "comm_anomaly:family:tp/all_reduce" and f.ranks == ()


def test_slow_link_at_16_ranks_names_the_rank() -> None:
    """tp family of two groups, dp family of eight pairs: the common member is named."""
    (f,) = detect_comm(families(ranks=16, slow_rank=11))
    assert f.ranks == (11,) and f.key == "comm_anomaly:rank:11"


def test_a_single_group_family_is_not_judged() -> None:
    """The world group of a small job: no peers, nobody to single out (the slowdown
    detector reports the job getting slower)."""
    slow = [f for f in families(ranks=8, slow={"tp-0": (100, None, 3.0)}) if f.kind == "tp"]
    assert len(slow[0].group_names) == 1
    assert detect_comm(slow) == []


def test_blips_and_short_windows() -> None:
    assert detect_comm(families(slow={"tp-2": (100, 104, 10.0)})) == []
    short = [
        CollectiveFamily(
            kind=f.kind,
            op=f.op,
            group_names=f.group_names,
            members=f.members,
            nbytes=f.nbytes[:, :5],
            duration_s=f.duration_s[..., :5],
        )
        for f in families()
    ]
    assert detect_comm(short) == []
    assert detect_comm([]) == []


def test_missing_records_and_zero_durations() -> None:
    fams = families(slow_rank=19)
    fams[0].duration_s[:, :, 10:20] = np.nan  # nobody reported these steps
    fams[0].duration_s[0, 0, 30] = 0.0  # a bogus reading
    fams[1].duration_s[:, 3, :] = np.nan  # a member that never reports
    (f,) = detect_comm(fams)
    assert f.ranks == (19,)


def test_families_from_flat_records_match() -> None:
    fams = families(slow_rank=19)
    rank, step, group, op, nbytes, dur = [], [], [], [], [], []
    for fam in fams:
        g, m, s = np.indices(fam.duration_s.shape)
        rank.append(fam.members[g, m].ravel())
        step.append((s + 500).ravel())
        group.append(np.asarray(fam.group_names)[g].ravel())
        op.append(np.full(g.size, fam.op))
        nbytes.append(fam.nbytes[g, s].ravel())
        dur.append(fam.duration_s.ravel())
    members = {
        n: list(ms)
        for fam in fams
        for n, ms in zip(fam.group_names, fam.members.tolist(), strict=True)
    }
    del members["dp-0"]  # inferred from the records
    extra = np.array([999]), np.array([500]), np.array(["tp-0"]), np.array(["all_reduce"])
    rank.append(extra[0])  # not a member: dropped
    step.append(extra[1])
    group.append(extra[2])
    op.append(extra[3])
    nbytes.append(np.array([1.0]))
    dur.append(np.array([1.0]))

    built, steps = families_from_records(
        *(np.concatenate(a) for a in (rank, step, group, op, nbytes, dur)), members=members
    )

    assert steps.tolist() == list(range(500, 500 + S))
    assert sorted(f.name for f in built) == ["dp/all_reduce", "tp/all_reduce"]
    for fam in built:
        (orig,) = [f for f in fams if f.name == fam.name]
        order = [fam.group_names.index(n) for n in orig.group_names]
        np.testing.assert_array_equal(fam.members[order], orig.members)
        np.testing.assert_allclose(fam.duration_s[order], orig.duration_s)
    (f,) = detect_comm(built, steps=steps)
    assert f.ranks == (19,) and f.first_step == 600


def test_group_kind() -> None:
    assert [group_kind(n) for n in ("tp-3", "dp_12", "pp:0", "dp", "ep7", "x")] == [
        "tp",
        "dp",
        "pp",
        "dp",
        "ep",
        "x",
    ]


def test_timing_at_scale() -> None:
    fams = families(ranks=16_384, slow_rank=12_345)
    detect_comm(fams)
    t0 = time.perf_counter()
    (f,) = detect_comm(fams)
    elapsed = time.perf_counter() - t0
    assert f.ranks == (12_345,)
    print(f"\ndetect_comm 16384 ranks x 200 steps (tp=8, dp=2048): {1e3 * elapsed:.1f} ms")

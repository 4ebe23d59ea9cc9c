"""The op-sequence drift detector on synthetic fingerprint schedules, replayed step by step
the way the backend runs it: a sliding window of the last 200 steps, the job's first step
of each fingerprint as ingest records it."""

from __future__ import annotations

from collections.abc import Callable

from detectors import registry
from detectors.finding import Finding
from detectors.opseq import OpSeqConfig, detect_opseq_change
from detectors.window import OpSeqWindow, ShapeInfo, Window

Schedule = Callable[[int, int], str | None]  # (step, rank) -> shape_fp


def window_at(
    schedule: Schedule,
    now: int,
    *,
    ranks: int = 4,
    width: int = 200,
    info: dict[str, ShapeInfo] | None = None,
) -> OpSeqWindow:
    """What the backend loads after step ``now``: the last ``width`` steps."""
    steps = list(range(max(0, now - width + 1), now + 1))
    first: dict[str, int] = {}
    for n in range(now + 1):  # the job's record: first step of each fingerprint
        for r in range(ranks):
            fp = schedule(n, r)
            if fp is not None:
                first.setdefault(fp, n)
    grid = [[schedule(n, r) for n in steps] for r in range(ranks)]
    seen = {fp for row in grid for fp in row if fp is not None}
    known = {
        fp: ShapeInfo(
            first_step=first[fp],
            opseq=(info or {}).get(fp, ShapeInfo(0)).opseq,
            structure=(info or {}).get(fp, ShapeInfo(0)).structure,
        )
        for fp in seen
    }
    return OpSeqWindow.from_grid(
        steps=steps,
        ranks=range(ranks),
        shape_fp=grid,
        known=known,
        job_first_step=min(first.values()),
    )


def replay(schedule: Schedule, until: int, **kw: object) -> dict[int, list[Finding]]:
    """Findings after every step 0 … ``until``."""
    return {
        n: detect_opseq_change(window_at(schedule, n, **kw))  # type: ignore[arg-type]
        for n in range(until + 1)
    }


def episodes(found: dict[int, list[Finding]]) -> dict[str, int]:
    """How many separate runs of detections each key had (each would be an incident)."""
    runs: dict[str, int] = {}
    active_before: set[str] = set()
    for n in sorted(found):
        active = {f.key for f in found[n]}
        for key in active - active_before:
            runs[key] = runs.get(key, 0) + 1
        active_before = active
    return runs


def test_a_change_is_found_within_ten_steps_with_its_first_step():
    found = replay(lambda n, r: "a" if n < 100 else "b", 140)
    detected = min(n for n, fs in found.items() if fs)
    assert 100 <= detected <= 110
    [f] = found[detected]
    assert (f.kind, f.key, f.severity, f.first_step) == (
        "opseq_change",
        "opseq_change:b",
        "info",
        100,
    )
    assert f.ranks == ()  # every rank changed
    assert f.evidence["from_shape_fp"] == "a" and f.evidence["to_shape_fp"] == "b"
    assert f.evidence["steady_steps"] == 5 and f.evidence["ranks_changed"] == 4
    assert all(not found[n] for n in range(detected))


def test_a_one_off_step_is_ignored():
    found = replay(lambda n, r: "odd" if n == 50 else "a", 120)
    assert not any(found.values())


def test_the_jobs_first_fingerprint_is_no_change():
    found = replay(lambda n, r: "a", 30)
    assert not any(found.values())


def test_alternating_buckets_give_one_incident_per_new_fingerprint():
    buckets = ["a", "b", "a", "b", "c", "a", "b", "c", "a"]
    found = replay(lambda n, r: buckets[min(n // 20, len(buckets) - 1)], 400)
    assert episodes(found) == {"opseq_change:b": 1, "opseq_change:c": 1}
    firsts = {f.key: f.first_step for fs in found.values() for f in fs}
    assert firsts == {"opseq_change:b": 20, "opseq_change:c": 80}


def test_going_back_to_an_old_fingerprint_finds_nothing():
    found = replay(lambda n, r: "b" if 100 <= n < 160 else "a", 260)
    assert episodes(found) == {"opseq_change:b": 1}
    assert not any(found[n] for n in range(165, 261))  # back on a: nothing new


def test_the_finding_resolves_fresh_steps_after_the_change():
    found = replay(lambda n, r: "a" if n < 10 else "b", 260)
    assert found[100] and found[209]
    assert not found[210]  # b first seen at 10: no longer fresh 200 steps later


def test_a_fingerprint_first_seen_as_a_one_off_counts_from_its_steady_onset():
    found = replay(lambda n, r: "b" if n == 30 or n >= 80 else "a", 120)
    detected = min(n for n, fs in found.items() if fs)
    assert detected == 84 and found[detected][0].first_step == 80


def test_only_the_ranks_that_changed_are_named():
    # Pipeline stages run different sequences: only stage 0 (ranks 0, 1) changes.
    found = replay(lambda n, r: f"s{r // 2}" + ("-long" if r < 2 and n >= 60 else ""), 80)
    [f] = found[80]
    assert (f.key, f.ranks, f.evidence["from_shape_fp"]) == ("opseq_change:s0-long", (0, 1), "s0")
    assert f.score == 0.5


def test_a_gap_in_a_ranks_reports_does_not_break_its_steady_state():
    def schedule(n: int, r: int) -> str | None:
        if r == 1 and n in (102, 103):
            return None  # rank 1 sent no fingerprint on two steps
        return "a" if n < 100 else "b"

    found = replay(schedule, 104)
    assert [f.ranks for f in found[104]] == [()]


def test_structure_or_shape_change_from_the_op_sequences():
    def change(to: ShapeInfo) -> str:
        info = {"a": ShapeInfo(0, opseq="op-a", structure="s1"), "b": to}
        [f] = detect_opseq_change(window_at(lambda n, r: "a" if n < 20 else "b", 30, info=info))
        assert f.evidence["from_opseq"] == "op-a"
        assert f.evidence["to_opseq"] == to.opseq
        return str(f.evidence["change"])

    assert change(ShapeInfo(0, opseq="op-b", structure="s2")) == "structure"
    assert change(ShapeInfo(0, opseq="op-b", structure="s1")) == "shapes"
    assert change(ShapeInfo(0)) == "unknown"  # b not captured yet


def test_steady_steps_is_configurable():
    w = window_at(lambda n, r: "a" if n < 100 else "b", 102)
    assert detect_opseq_change(w) == []
    assert detect_opseq_change(w, OpSeqConfig(steady_steps=3))[0].first_step == 100


def test_the_detector_is_registered_for_the_opseq_part():
    w = window_at(lambda n, r: "a" if n < 100 else "b", 110)
    result = registry.run(Window(opseq=w))
    assert result.ran == ["opseq"] and not result.failures
    assert [f.key for f in result.findings] == ["opseq_change:b"]
    assert "opseq_change" in result.covered

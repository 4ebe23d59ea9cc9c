"""Reading PyTorch profiler (Kineto) traces: per-iteration step time, the GPU breakdown as
Holistic Trace Analysis computes it, collectives, op-sequence fingerprints; streamed in
bounded memory; a bad file is one line naming the file and the problem."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from backend.importers import kineto_stream
from backend.importers.kineto_stream import KinetoError, iter_trace
from backend.importers.kineto_trace import read_trace
from backend.importers.kineto_upload import load_traces, render, request_bodies

DATA = Path(__file__).parents[2] / "data" / "kineto"
HTA_RANK0 = DATA / "sampled_rank-0.json.gz"
GLOO = DATA / "gloo_ddp_2ranks"

# HTA 0.5.0's own numbers for this file, per iteration (microseconds; overlap in %):
# TraceAnalysis(include_last_profiler_step=True), its trace cut to one iteration, then
# get_temporal_breakdown() and get_comm_comp_overlap() (bench/kineto_vs_hta.py).
HTA = {
    551: {"kernel": 600058, "idle": 321378, "compute": 106252, "non_compute": 172428, "pct": 11.81},
    552: {"kernel": 615601, "idle": 346625, "compute": 104068, "non_compute": 164908, "pct": 18.00},
}


def _us(seconds: float) -> int:
    return round(seconds * 1e6)


def test_the_real_trace_gives_hta_numbers_per_iteration() -> None:
    trace = read_trace(HTA_RANK0)
    assert (trace.rank, trace.world_size) == (0, 128)
    assert [it.step for it in trace.iterations] == [551, 552]
    for it in trace.iterations:
        gpu, want = it.gpu, HTA[it.step]
        assert gpu is not None
        assert _us(gpu.span_s) == want["kernel"]
        assert _us(gpu.idle_s) == want["idle"]
        assert _us(gpu.compute_s) == want["compute"]
        assert _us(gpu.non_compute_s) == want["non_compute"]
        assert gpu.overlap_pct == pytest.approx(want["pct"], abs=0.005)


def test_the_real_trace_steps_and_exposed_communication() -> None:
    first, second = read_trace(HTA_RANK0).iterations
    # ProfilerStep#551: ts 1682725898079292 µs, dur 607312 µs; the step ends at ts + dur.
    assert first.duration_s == pytest.approx(0.607312)
    assert first.ts == pytest.approx(1682725898.686604)
    assert second.duration_s == pytest.approx(0.622928)
    # NCCL kernels: 195327 µs of union in 551, 23068 µs of it under computation kernels.
    assert first.gpu is not None and _us(first.gpu.comm_s) == 195327
    assert _us(first.gpu.overlap_s) == 23068
    assert _us(first.comm_s or 0) == 195327 - 23068


def test_the_real_trace_collectives_are_named_by_their_calls() -> None:
    found = {(c.step, c.group, c.op): c for c in read_trace(HTA_RANK0).collectives}
    assert sorted(found) == [
        (551, "stream 203", "all_gather_into_tensor"),
        (551, "stream 84", "all_reduce"),
        (551, "stream 84", "all_to_all"),
        (552, "stream 203", "all_gather_into_tensor"),
        (552, "stream 84", "all_reduce"),
        (552, "stream 84", "all_to_all"),
    ]
    a2a = found[(551, "stream 84", "all_to_all")]
    # Two nccl:all_to_all calls: 384 longs and 419430400 bytes; kernels of 30669 + 62783 µs.
    assert (a2a.count, a2a.bytes) == (2, 384 * 8 + 419430400)
    assert _us(a2a.duration_s) == 30669 + 62783
    ar = found[(551, "stream 84", "all_reduce")]
    assert (ar.count, ar.bytes) == (2, (19618307 + 26955536) * 4)


def test_the_real_trace_op_sequence_is_every_operator_of_the_iteration() -> None:
    trace = read_trace(HTA_RANK0)
    a, b = trace.iterations
    assert a.opseq is not None and b.opseq is not None and a.opseq != b.opseq  # sampled trace
    # 2,329 cpu_op events in the file: 1,163 in step 551, 1,166 in 552.
    assert [len(trace.opseqs[it.opseq or ""]) for it in (a, b)] == [1163, 1166]
    assert trace.opseqs[a.opseq][1] == [
        "fbgemm::permute_sparse_features",
        [[300], [300, 2048], [16334339], []],
        0,
    ]


def test_gloo_ranks_make_a_multi_rank_job_with_one_op_sequence() -> None:
    traces = load_traces([GLOO])
    assert [(t.rank, t.world_size) for t in traces] == [(0, 2), (1, 2)]
    assert {it.step for t in traces for it in t.iterations} == {2, 3, 4}
    assert all(it.gpu is None for t in traces for it in t.iterations)  # CPU-only trace
    fingerprints = {it.opseq for t in traces for it in t.iterations}
    assert len(fingerprints) == 1  # the same model, every iteration, on both ranks
    colls = [c for t in traces for c in t.collectives]
    assert {(c.group, c.op, c.count, c.bytes) for c in colls} == {("world", "all_reduce", 1, 38440)}
    for t in traces:  # CPU collectives: the step's time in gloo:all_reduce
        for it in t.iterations:
            [c] = [c for c in t.collectives if c.step == it.step]
            assert it.comm_s == pytest.approx(min(c.duration_s, it.duration_s))
    table = render(traces)
    assert "rank 1 (rank-1.json.gz): 3 iterations" in table


def test_reads_across_chunk_boundaries_as_json_load_does(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = json.loads(gzip.decompress((GLOO / "rank-0.json.gz").read_bytes()))
    monkeypatch.setattr(kineto_stream, "CHUNK", 7)
    events = [v for kind, _, v in iter_trace(GLOO / "rank-0.json.gz") if kind == "event"]
    meta = {k: v for kind, k, v in iter_trace(GLOO / "rank-0.json.gz") if kind == "meta"}
    assert events == whole["traceEvents"]
    assert meta == {k: v for k, v in whole.items() if k != "traceEvents"}


def test_a_plain_json_file_reads_like_its_gzip(tmp_path: Path) -> None:
    plain = tmp_path / "rank-0.json"
    plain.write_bytes(gzip.decompress((GLOO / "rank-0.json.gz").read_bytes()))
    assert read_trace(plain).iterations == read_trace(GLOO / "rank-0.json.gz").iterations


def test_bodies_fit_the_budget_and_keep_every_iteration() -> None:
    traces = load_traces([HTA_RANK0])
    budget = 40 * 1024  # less than one op sequence (66 kB of JSON each)
    bodies = request_bodies(traces, budget=budget)
    assert len(bodies) == 2  # a part an iteration; a rank appears once a body
    for body in bodies:
        assert len(json.dumps(body, separators=(",", ":"))) <= budget
        assert body["world_size"] == 128
    parts = [r for b in bodies for r in b["ranks"]]
    assert [it["step"] for p in parts for it in p["iterations"]] == [551, 552]
    shipped = {o["hash"]: o["ops"] for p in parts for o in p["opseqs"]}
    assert set(shipped) == set(traces[0].opseqs)  # every fingerprint, its ops cut to fit
    for fingerprint, ops in shipped.items():
        assert 0 < len(ops) < len(traces[0].opseqs[fingerprint])
        assert ops == traces[0].opseqs[fingerprint][: len(ops)]
    assert len(request_bodies(traces)) == 1  # the default budget takes it whole


def _trace(tmp_path: Path, content: Any, name: str = "rank-0.json") -> Path:
    p = tmp_path / name
    p.write_text(content if isinstance(content, str) else json.dumps(content))
    return p


STEP = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 10, "dur": 5}


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("", "not a PyTorch profiler trace"),
        ("[1, 2]", "not a PyTorch profiler trace"),
        ('{"traceEvents": [{"ph": "X"', "not valid JSON"),
        ('{"schemaVersion": 1}', "no traceEvents"),
        (
            {"traceEvents": [{"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 1}]},
            "no ProfilerStep#N",
        ),
        ({"traceEvents": [STEP, {**STEP, "ts": 20}]}, "ProfilerStep#3 appears more than once"),
        ({"traceEvents": [{**STEP, "ts": "soon"}]}, "event 0 ('ProfilerStep#3') has no valid"),
        ({"traceEvents": [STEP], "baseTimeNanoseconds": -1}, "baseTimeNanoseconds"),
    ],
)
def test_a_bad_file_is_named_in_one_line(tmp_path: Path, content: Any, says: str) -> None:
    path = _trace(tmp_path, content)
    with pytest.raises(KinetoError) as caught:
        read_trace(path)
    message = str(caught.value)
    assert message.startswith(str(path)) and says in message and "\n" not in message


def test_a_trace_without_a_rank_asks_for_one(tmp_path: Path) -> None:
    path = _trace(tmp_path, {"traceEvents": [STEP]}, name="trace.json")
    with pytest.raises(KinetoError, match="pass --rank"):
        read_trace(path)
    assert read_trace(path, rank=5).rank == 5


def test_two_files_of_one_rank_are_refused(tmp_path: Path) -> None:
    a = _trace(tmp_path, {"traceEvents": [STEP]}, name="a_rank3.json")
    b = _trace(tmp_path, {"traceEvents": [STEP]}, name="b_rank3.json")
    with pytest.raises(KinetoError, match="rank 3 again"):
        load_traces([a, b])
    with pytest.raises(KinetoError, match="--rank names the rank of one file"):
        load_traces([a, b], rank=1)


def test_a_broken_gzip_is_named(tmp_path: Path) -> None:
    cut = tmp_path / "rank-0.json.gz"
    cut.write_bytes(HTA_RANK0.read_bytes()[:5000])
    with pytest.raises(KinetoError, match=r"rank-0\.json\.gz: cannot read"):
        read_trace(cut)

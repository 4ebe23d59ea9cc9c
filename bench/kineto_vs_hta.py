"""Vigil's Kineto breakdown against Holistic Trace Analysis's own numbers, per rank and
iteration; optionally, what reading a big trace costs.

From the repository root, with HTA in a scratch virtual environment (it is no dependency
of Vigil)::

    python3 -m venv /tmp/hta_venv && /tmp/hta_venv/bin/pip install HolisticTraceAnalysis
    .venv/bin/python bench/kineto_vs_hta.py --hta-python /tmp/hta_venv/bin/python
    .venv/bin/python bench/kineto_vs_hta.py TRACE_DIR_OR_FILES… --hta-python …
    .venv/bin/python bench/kineto_vs_hta.py --big 200     # + a 200× trace: time, peak memory

HTA's numbers: ``TraceAnalysis(trace_dir, include_last_profiler_step=True)``, its trace cut
to one iteration at a time (HTA's own ``iteration`` column), then ``get_temporal_breakdown``
(idle, compute, non-compute, kernel time) and ``get_comm_comp_overlap``. Vigil's:
``backend.importers.kineto_trace.read_trace``. The table prints both and the difference.
Without HTA (not importable here, no ``--hta-python``/``$HTA_PYTHON``) it says how to
install it and exits 2.

``--big N`` writes a trace of the default file's iterations repeated N times (timestamps,
steps and correlation ids shifted; gzipped) and reads it in a child process each way:
Vigil's streaming reader, and ``json.load`` (what a reader that loads the file does before
any analysis), reporting wall time and peak resident memory.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT = ROOT / "tests" / "data" / "kineto" / "sampled_rank-0.json.gz"
INSTALL = (
    "HolisticTraceAnalysis is not installed here. Install it in a scratch environment:\n"
    "  python3 -m venv /tmp/hta_venv && /tmp/hta_venv/bin/pip install HolisticTraceAnalysis\n"
    "then: .venv/bin/python bench/kineto_vs_hta.py --hta-python /tmp/hta_venv/bin/python"
)
# Run by HTA's own interpreter: its per-rank, per-iteration numbers as JSON.
HTA_SCRIPT = """
import json, sys, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True)
full = dict(a.t.traces)
out = []
for it in a.t.get_iterations():
    a.t.traces = {r: df[df["iteration"] == it] for r, df in full.items()}
    tb = a.get_temporal_breakdown(visualize=False).to_dict("records")
    ov = {r["rank"]: r["comp_comm_overlap_pctg"]
          for r in a.get_comm_comp_overlap(visualize=False).to_dict("records")}
    for r in tb:
        out.append({"rank": int(r["rank"]), "iteration": int(it),
                    "kernel": float(r["kernel_time(us)"]), "idle": float(r["idle_time(us)"]),
                    "compute": float(r["compute_time(us)"]),
                    "non_compute": float(r["non_compute_time(us)"]),
                    "overlap_pct": float(ov[r["rank"]])})
print(json.dumps(out))
"""


def hta_numbers(trace_dir: Path, hta_python: str | None) -> list[dict[str, Any]] | None:
    """HTA's numbers for every trace in ``trace_dir``; ``None`` when HTA is not available."""
    python = hta_python
    if python is None:
        try:
            import hta  # noqa: F401
        except ImportError:
            return None
        python = sys.executable
    done = subprocess.run(
        [python, "-c", HTA_SCRIPT, str(trace_dir)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        sys.exit(f"HTA failed:\n{done.stderr[-2000:]}")
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def vigil_numbers(files: list[Path]) -> dict[tuple[int, int], dict[str, float]]:
    from backend.importers.kineto_trace import read_trace

    out = {}
    for f in files:
        trace = read_trace(f)
        for it in trace.iterations:
            if it.gpu is None:
                continue
            g = it.gpu
            out[(trace.rank, it.step)] = {
                "kernel": g.span_s * 1e6,
                "idle": g.idle_s * 1e6,
                "compute": g.compute_s * 1e6,
                "non_compute": g.non_compute_s * 1e6,
                "overlap_pct": round(g.overlap_pct or 0.0, 2),
            }
    return out


METRICS = (
    ("kernel", "kernel span µs"),
    ("idle", "idle µs"),
    ("compute", "compute µs"),
    ("non_compute", "non-compute µs"),
    ("overlap_pct", "overlap %"),
)


def table(vigil: dict[tuple[int, int], dict[str, float]], hta: list[dict[str, Any]]) -> str:
    head = "| rank | iteration | " + " | ".join(f"{n} (Vigil / HTA)" for _, n in METRICS) + " |"
    lines = [head, "|" + "---|" * (2 + len(METRICS))]
    worst = 0.0
    for row in sorted(hta, key=lambda r: (r["rank"], r["iteration"])):
        mine = vigil.get((row["rank"], row["iteration"]))
        cells = []
        for key, _ in METRICS:
            if mine is None:
                cells.append(f"— / {row[key]:g}")
                continue
            worst = max(worst, abs(mine[key] - row[key]))
            cells.append(f"{mine[key]:g} / {row[key]:g}")
        lines.append(f"| {row['rank']} | {row['iteration']} | " + " | ".join(cells) + " |")
    missing = sorted(set(vigil) - {(r["rank"], r["iteration"]) for r in hta})
    lines.append("")
    lines.append(f"largest difference: {worst:g}; iterations Vigil has that HTA has not: {missing}")
    return "\n".join(lines)


def big_trace(source: Path, copies: int, out: Path) -> tuple[int, int]:
    """``source``'s events ``copies`` times over, shifted; returns (events, bytes)."""
    d = json.loads(gzip.decompress(source.read_bytes()))
    events = d.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), (int, float)) and "dur" in e]
    span = max(e["ts"] + e["dur"] for e in timed) - min(e["ts"] for e in timed) + 1000
    corr = 1 + max(int(e.get("args", {}).get("correlation", 0) or 0) for e in events)
    steps = [
        int(e["name"].split("#")[1])
        for e in events
        if str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    per = max(steps) - min(steps) + 1
    n = 0
    with gzip.open(out, "wt", compresslevel=1) as f:
        f.write(json.dumps(d)[:-1] + ', "traceEvents": [')
        for k in range(copies):
            for e in events:
                e2 = dict(e)
                if "ts" in e2 and isinstance(e2["ts"], (int, float)):
                    e2["ts"] = e2["ts"] + k * span
                if str(e2.get("name", "")).startswith("ProfilerStep#"):
                    e2["name"] = f"ProfilerStep#{int(e2['name'].split('#')[1]) + k * per}"
                args = e2.get("args")
                if isinstance(args, dict) and "correlation" in args:
                    e2["args"] = {**args, "correlation": args["correlation"] + k * corr}
                f.write(("," if n else "") + json.dumps(e2))
                n += 1
        f.write("]}")
    return n, out.stat().st_size


CHILD = {
    "vigil": "from backend.importers.kineto_trace import read_trace; "
    "trace = read_trace(sys.argv[1]); print(len(trace.iterations))",
    "json.load": "import gzip, json; d = json.load(gzip.open(sys.argv[1], 'rt')); "
    "print(len(d['traceEvents']))",
}


def measure(kind: str, path: Path) -> tuple[float, float]:
    """Seconds and peak resident MiB of reading ``path`` in a fresh process."""
    code = (
        f"import resource, sys, time; sys.path.insert(0, {str(ROOT)!r}); "
        f"t0 = time.perf_counter(); {CHILD[kind]}; print(time.perf_counter() - t0, "
        "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True
    )
    secs, rss_kib = done.stdout.split()[-2:]
    return float(secs), int(rss_kib) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("traces", nargs="*", type=Path, default=[DEFAULT])
    parser.add_argument("--hta-python", default=os.environ.get("HTA_PYTHON"))
    parser.add_argument("--big", type=int, default=0, help="also read a trace N times as big")
    opts = parser.parse_args()
    files = [f for p in opts.traces for f in (sorted(p.glob("*.json*")) if p.is_dir() else [p])]
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:
            shutil.copy(f, Path(tmp) / f.name)
        hta = hta_numbers(Path(tmp), opts.hta_python)
    if hta is None:
        print(INSTALL, file=sys.stderr)
        return 2
    print(table(vigil_numbers(files), hta))
    if opts.big:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "big_rank-0.json.gz"
            events, size = big_trace(files[0], opts.big, path)
            print(f"\nbig trace: {events:,} events, {size / 2**20:.1f} MiB gzipped")
            for kind in CHILD:
                secs, mib = measure(kind, path)
                print(f"{kind:>10}: {secs:6.1f} s, peak RSS {mib:7.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

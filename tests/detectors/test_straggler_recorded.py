"""The straggler detector on a real recorded gloo run (tests/data/demo_gloo): the injected
straggler is named, the OS scheduling blips around it are not."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from detectors.straggler import detect_stragglers

DATA = Path(__file__).parents[1] / "data" / "demo_gloo" / "straggler_rank2_steps.csv"


def _load() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = list(csv.DictReader(DATA.open()))
    steps = sorted({int(r["step"]) for r in rows})
    col = {s: i for i, s in enumerate(steps)}
    times = np.full((4, len(steps)), np.nan)
    comm = times.copy()
    for r in rows:
        times[int(r["rank"]), col[int(r["step"])]] = float(r["duration_s"])
        comm[int(r["rank"]), col[int(r["step"])]] = float(r["comm_s"])
    return np.array(steps), times, comm


def test_the_injected_straggler_is_named_and_the_scheduling_blips_are_not():
    steps, times, comm = _load()
    named: dict[int, int] = {}  # rank -> first window end that named it
    for end in range(5, steps.size + 1):  # every tick's window, as the runner slides it
        for f in detect_stragglers(steps[:end], times[:, :end], comm[:, :end]):
            named.setdefault(f.ranks[0], int(steps[end - 1]))
    assert set(named) == {2}, named
    assert named[2] <= 30  # the fault starts at step 20


def test_the_straggler_is_dated_from_its_onset():
    steps, times, comm = _load()
    [f] = detect_stragglers(steps, times, comm)
    assert f.ranks == (2,) and not f.active
    assert 15 <= f.first_step <= 20 and 58 <= f.last_step <= 60
    assert f.severity == "critical"

"""The slowdown detector's longer view (issue 17): with steps of 0.1 s, the backend's window of
200 steps holds 20 s, so a slowdown could never last the 60 s it must before it opens. The
window carries the job's step time over the steps before it (``StepHistory``, one value per
step), as far back as ``SlowdownConfig.view_s`` of step time."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from detectors import registry
from detectors.finding import Finding
from detectors.slowdown import SlowdownConfig, history_steps
from detectors.window import StepHistory, StepWindow, Window

WIDTH = 200  # the backend's default window (VIGIL_DETECT_WINDOW_STEPS)
RANKS = 4
STEP_S = 0.1


def busy_host(seed: int, seconds: float, step_s: float = STEP_S) -> np.ndarray:
    """``(S,)`` step times of a clean job on a busy two-core host, as ``bench/clean_runs.py``
    loads one: two competitors, each in busy spells of 0.05–2 s and idle ones of 0–1 s; each
    busy one slows the step by 25–60% (per spell); lognormal jitter of 8% per step; and
    one step in 200 a blip (GC, a page fault storm) of 2–5x."""
    rng = np.random.default_rng(seed)
    spells = []  # (start, end, slowdown) of busy spells
    for _ in range(2):
        t = rng.uniform(0, 1)
        while t < seconds:
            busy = rng.uniform(0.05, 2.0)
            spells.append((t, t + busy, rng.uniform(0.25, 0.6)))
            t += busy + rng.uniform(0.0, 1.0)
    starts = np.array([s[0] for s in spells])
    ends = np.array([s[1] for s in spells])
    extra = np.array([s[2] for s in spells])
    out, t = [], 0.0
    while t < seconds:
        busy = (starts <= t) & (t < ends)
        d = step_s * (1 + extra[busy].sum()) * rng.lognormal(0, 0.08)
        if rng.random() < 1 / 200:
            d *= rng.uniform(2, 5)
        out.append(d)
        t += d
    return np.array(out)


def job(step: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rank × step (step, comm, data) of a synchronous job with this step time: every rank
    shares it; a third of it waits in collectives, give or take per rank."""
    rng = np.random.default_rng(len(step))
    steps = np.broadcast_to(step, (RANKS, step.size)).copy()
    comm = steps * rng.uniform(0.25, 0.4, steps.shape)
    return steps, comm, np.full(steps.shape, 0.002)


def slowdown_at(n_done: int, arrays: tuple[np.ndarray, np.ndarray, np.ndarray]) -> list[Finding]:
    """What the registered slowdown detector finds once ``n_done`` steps are in, given what
    the backend gives it: the last ``WIDTH`` steps and the history it asks for."""
    step, comm, data = (a[:, :n_done] for a in arrays)
    lo = max(0, n_done - WIDTH)
    ids = np.arange(n_done)
    window = StepWindow.from_arrays(
        steps=ids[lo:],
        ranks=range(RANKS),
        step_time=step[:, lo:],
        comm_time=comm[:, lo:],
        data_time=data[:, lo:],
    )
    first = max(0, lo - history_steps(window))
    history = StepHistory.from_arrays(
        steps=ids[first:lo],
        step_time=step[:, first:lo],
        comm_time=comm[:, first:lo],
        data_time=data[:, first:lo],
    )
    window = dataclasses.replace(window, history=history)
    (detector,) = [d for d in registry.detectors() if d.name == "slowdown"]
    return detector.detect(Window(steps=window))


def runs_every_2s(step: np.ndarray) -> list[int]:
    """``n_done`` at each detection run: every 2 s of the job's time, as the backend runs."""
    ends = np.cumsum(step)
    return sorted(set(np.searchsorted(ends, np.arange(2.0, ends[-1], 2.0), side="right")))


def test_history_reaches_view_s_of_step_time() -> None:
    cfg = SlowdownConfig()
    short = StepWindow.from_arrays(
        steps=range(WIDTH), ranks=[0, 1], step_time=np.full((2, WIDTH), 0.1)
    )
    assert history_steps(short) == round(cfg.view_s / 0.1) - WIDTH
    long = StepWindow.from_arrays(
        steps=range(WIDTH), ranks=[0, 1], step_time=np.full((2, WIDTH), 1.0)
    )
    assert history_steps(long) == 0  # 200 s of steps: the window is view enough
    tiny = StepWindow.from_arrays(
        steps=range(WIDTH), ranks=[0], step_time=np.full((1, WIDTH), 1e-3)
    )
    assert history_steps(tiny) == cfg.max_view_steps - WIDTH
    assert (
        history_steps(StepWindow.from_arrays(steps=[], ranks=[0], step_time=np.zeros((1, 0)))) == 0
    )


def test_job_wide_slowdown_with_short_steps_is_found() -> None:
    """0.1 s steps, then every rank 1.5x slower for 90 s (600 steps): the last 200 steps
    alone (30 s) cannot show it; with the history the window carries, it opens."""
    rng = np.random.default_rng(1)
    clean = STEP_S * rng.lognormal(0, 0.05, 1500)  # 150 s
    slow = 1.5 * STEP_S * rng.lognormal(0, 0.05, 600)  # 90 s
    arrays = job(np.r_[clean, slow])
    n = arrays[0].shape[1]

    (f,) = slowdown_at(n, arrays)

    assert (f.kind, f.key, f.ranks, f.active) == ("slowdown", "slowdown", (), True)
    assert abs(f.first_step - 1500) <= 5 and f.last_step == n - 1
    assert f.evidence["rise_pct"] == pytest.approx(50, abs=5)
    assert f.evidence["slow_for_s"] == pytest.approx(90, rel=0.05)
    assert f.evidence["component"] == "compute"
    window_only = StepWindow.from_arrays(
        steps=range(n - WIDTH, n),
        ranks=range(RANKS),
        step_time=arrays[0][:, -WIDTH:],
        comm_time=arrays[1][:, -WIDTH:],
    )
    (detector,) = [d for d in registry.detectors() if d.name == "slowdown"]
    assert detector.detect(Window(steps=window_only)) == []  # what the backend did before


def test_an_input_stall_over_the_longer_view_is_blamed_on_data() -> None:
    """The history carries the components too: a data loader 50 ms slower per step (every
    rank) is a data slowdown, the same over the history's steps and the window's."""
    rng = np.random.default_rng(3)
    step = STEP_S * rng.lognormal(0, 0.05, 2100)
    step, comm, data = job(step)
    data[:, 1500:] += 0.05
    step[:, 1500:] += 0.05

    (f,) = slowdown_at(step.shape[1], (step, comm, data))

    assert f.evidence["component"] == "data" and abs(f.first_step - 1500) <= 5
    assert f.evidence["data_delta_s"] == pytest.approx(0.05, rel=0.1)


def test_streamed_slowdown_opens_after_60_s_with_one_onset() -> None:
    """Run after run, as the window slides: nothing until the slowdown has lasted 60 s, then
    the same onset every time (one incident, never re-dated into a new one)."""
    rng = np.random.default_rng(2)
    step = np.r_[STEP_S * rng.lognormal(0, 0.05, 1200), 1.5 * STEP_S * rng.lognormal(0, 0.05, 900)]
    arrays = job(step)
    slow_since = np.cumsum(step) - step[:1200].sum()

    found = {n: slowdown_at(n, arrays) for n in runs_every_2s(step)}

    first = min(n for n, fs in found.items() if fs)
    assert 58 <= slow_since[first - 1] <= 64
    onsets = {f.first_step for n, fs in found.items() if n >= first for f in fs}
    assert all(found[n] for n in found if n >= first)
    assert max(onsets) - min(onsets) <= 3 and abs(min(onsets) - 1200) <= 5


@pytest.mark.parametrize("seed", range(6))
def test_clean_job_on_a_busy_host_never_opens_a_slowdown(seed: int) -> None:
    """Ten minutes of a clean 0.1 s-step job under contention, judged every 2 s over the
    longer view: the contention is there all along, so no stretch of it is a slowdown."""
    step = busy_host(seed, seconds=600.0)
    arrays = job(step)
    for n in runs_every_2s(step):
        assert slowdown_at(n, arrays) == [], n

"""The detector registry: registration, which detectors a window runs, isolation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from detectors import registry
from detectors.finding import KINDS, Finding
from detectors.window import LivenessWindow, StepWindow, Window


def steps_window(slow_rank: int | None = None) -> Window:
    times = np.full((4, 60), 0.3)
    if slow_rank is not None:
        times[slow_rank, 20:] = 0.6
    return Window(steps=StepWindow.from_arrays(steps=range(60), ranks=range(4), step_time=times))


def test_builtin_detectors_register_themselves():
    found = {d.name: d for d in registry.detectors()}
    assert {"straggler", "numerics", "slowdown", "comm", "memory", "hang"} <= set(found)
    assert found["hang"].kinds == {"hang", "crash"} and found["hang"].needs == {"liveness"}
    assert found["memory"].kinds == {"memory_pressure"}
    for d in found.values():
        assert d.kinds <= set(KINDS)


def test_a_window_runs_only_the_detectors_it_can_feed():
    result = registry.run(steps_window())
    assert "hang" not in result.ran and "comm" not in result.ran  # no liveness, no collectives
    assert {"straggler", "numerics", "slowdown", "memory"} <= set(result.ran)
    assert "hang" not in result.covered and "straggler" in result.covered
    sweep = Window(liveness=LivenessWindow(states=(), now=0.0, step_durations=np.array([])))
    assert registry.run(sweep).ran == ["hang"]
    assert registry.kinds_needing({"liveness"}) == {"hang", "crash"}


def test_a_raising_detector_is_isolated(monkeypatch):
    (straggler,) = [d for d in registry.detectors() if d.name == "straggler"]

    def boom(window: Window) -> list[Finding]:
        raise ValueError("bad data")

    monkeypatch.setitem(
        registry._DETECTORS,
        "numerics",
        dataclasses.replace(straggler, name="numerics", detect=boom),
    )
    result = registry.run(steps_window(slow_rank=1))
    assert [(f.detector, str(f.error)) for f in result.failures] == [("numerics", "bad data")]
    assert [f.kind for f in result.findings] == ["straggler"]  # the others still ran
    assert "slowdown" in result.covered


def test_a_finding_of_an_undeclared_kind_fails_its_detector(monkeypatch):
    def stray(window: Window) -> list[Finding]:
        return [Finding("nan", "critical", (0,), 1, 1.0, "nan", "nan")]

    fake = registry.Detector("fake", frozenset({"slowdown"}), frozenset({"steps"}), stray)
    monkeypatch.setitem(registry._DETECTORS, "fake", fake)
    result = registry.run(steps_window())
    assert [f.detector for f in result.failures] == ["fake"]
    assert "undeclared kinds ['nan']" in str(result.failures[0])
    assert not any(f.summary == "nan" for f in result.findings)


def test_registration_checks_kinds_and_needs():
    with pytest.raises(ValueError, match="unknown incident kinds"):
        registry.register("x", kinds={"bogus"}, needs={"steps"})
    with pytest.raises(ValueError, match="needs must be"):
        registry.register("x", kinds={"nan"}, needs={"tea"})


def test_a_name_is_registered_once(monkeypatch):
    monkeypatch.setattr(registry, "_DETECTORS", dict(registry._DETECTORS))

    def other(window: Window) -> list[Finding]:
        return []

    with pytest.raises(ValueError, match="registered twice"):
        registry.register("straggler", kinds={"straggler"}, needs={"steps"})(other)

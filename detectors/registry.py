"""The detector registry: every detector registers itself; one loop runs them, each isolated.

A detector is one module in ``detectors/`` with one registration — its name, the incident
kinds it can produce, and the window parts it needs (:mod:`detectors.window`)::

    @register("straggler", kinds={"straggler"}, needs={"steps"})
    def _detect(window: Window) -> list[Finding]:
        ...

The backend builds a :class:`~detectors.window.Window` once per run and calls
:func:`run`, which runs every registered detector whose needs the window meets. A detector
that raises, or returns a finding of a kind it did not declare, is isolated: its findings
are dropped, the failure is returned (the backend logs and counts it), and the others still
run. ``covered`` is the set of kinds that detectors which *ran and succeeded* can produce,
so an open incident is resolved by omission only when the detector that owns its kind
actually looked and found nothing.

    >>> from detectors.window import StepWindow, Window
    >>> w = Window(steps=StepWindow.from_arrays(steps=range(40), ranks=range(4),
    ...            step_time=[[0.3] * 40] * 4))
    >>> result = run(w)
    >>> result.findings, result.failures
    ([], [])
    >>> sorted(result.covered)[:3]
    ['loss_spike', 'memory_pressure', 'nan']
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from detectors.finding import KINDS, Finding
from detectors.window import PARTS, Window

DetectFn = Callable[[Window], list[Finding]]


@dataclass(frozen=True)
class Detector:
    """A registered detector: ``detect(window)`` → findings of ``kinds``."""

    name: str
    kinds: frozenset[str]
    needs: frozenset[str]
    detect: DetectFn

    def ready(self, window: Window) -> bool:
        return self.needs <= window.parts


@dataclass(frozen=True)
class Failure:
    detector: str
    error: BaseException

    def __str__(self) -> str:
        return f"detector {self.detector} failed: {type(self.error).__name__}: {self.error}"


@dataclass
class RunResult:
    findings: list[Finding] = field(default_factory=list)
    covered: set[str] = field(default_factory=set)  # kinds whose detectors ran and succeeded
    ran: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)


_DETECTORS: dict[str, Detector] = {}
_loaded = False


def register(
    name: str, *, kinds: Collection[str], needs: Collection[str]
) -> Callable[[DetectFn], DetectFn]:
    """Register ``fn(window) -> list[Finding]`` as detector ``name`` (a decorator)."""
    unknown_kinds = set(kinds) - set(KINDS)
    if unknown_kinds or not kinds:
        raise ValueError(f"detector {name}: unknown incident kinds {sorted(unknown_kinds)}")
    unknown_parts = set(needs) - set(PARTS)
    if unknown_parts or not needs:
        raise ValueError(f"detector {name}: needs must be some of {PARTS}, not {sorted(needs)}")

    def wrap(fn: DetectFn) -> DetectFn:
        existing = _DETECTORS.get(name)
        if existing is not None and existing.detect.__module__ != fn.__module__:
            where = existing.detect.__module__
            raise ValueError(f"detector {name!r} is registered twice (first in {where})")
        _DETECTORS[name] = Detector(name, frozenset(kinds), frozenset(needs), fn)
        return fn

    return wrap


def detectors() -> list[Detector]:
    """Every registered detector, by name. The first call imports each module of the
    ``detectors`` package, so a new module registers itself by being there."""
    global _loaded
    if not _loaded:
        import detectors as package

        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{module.name}")
        _loaded = True
    return [_DETECTORS[name] for name in sorted(_DETECTORS)]


def kinds_needing(parts: Iterable[str]) -> frozenset[str]:
    """The incident kinds of detectors that a window with ``parts`` runs."""
    have = frozenset(parts)
    return frozenset(k for d in detectors() if d.needs <= have for k in d.kinds)


def run(window: Window) -> RunResult:
    """Run every detector the window can feed; each one isolated from the others."""
    result = RunResult()
    for detector in detectors():
        if not detector.ready(window):
            continue
        result.ran.append(detector.name)
        try:
            found = detector.detect(window)
            stray = sorted({f.kind for f in found} - detector.kinds)
            if stray:
                raise ValueError(f"returned findings of undeclared kinds {stray}")
        except Exception as exc:  # isolate: one broken detector must not blind the others
            result.failures.append(Failure(detector.name, exc))
            continue
        result.findings += found
        result.covered |= detector.kinds
    return result

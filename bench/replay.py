"""What the backend does with findings and baselines, without a database: the evaluation's
replays (``bench/detection_eval.py``, ``bench/eval_arrival.py``, ``bench/eval_real.py``)
share it.

- :class:`IncidentTracker`: findings become incidents as ``backend/incidents/service.py``
  makes them (one per key while it stays open; an episode that is already over is recorded
  once); every incident opened is one :class:`Alert`.
- :class:`Baselines`: each rank's normal ratio for the straggler detector, learned once per
  job (``detectors.straggler.learn_baselines``, from the first window with enough steps) and
  handed back to every later window, as ``backend/detection/baselines.py`` keeps it.
- :func:`backend_window`: a window as a detection run judges it: cut before its unsettled
  tail (``detectors.settle.settled`` with the live-rank count), with the carried baselines
  and the step each rank's open straggler incident names it from.
- :func:`replay`: a finished job's step records (:class:`Telemetry`) delivered batch by
  batch in a given order to an in-process stand-in for the server (:class:`ServerView`),
  with a straggler detection run every few batches: the incidents it opens (:class:`Outcome`).

    >>> import numpy as np
    >>> keeper = Baselines(4)
    >>> t = np.ones((4, 30)); t[1] *= 1.08                  # rank 1: slower hardware
    >>> w = backend_window(keeper, steps=range(30), ranks=range(4), step_time=t, live_ranks=4)
    >>> w.straggler_baseline.round(2).tolist()
    [1.0, 1.08, 1.0, 1.0]
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from detectors import registry
from detectors.finding import Finding
from detectors.settle import settled
from detectors.straggler import learn_baselines
from detectors.window import StepWindow, Window

WINDOW = 200  # steps per detection window (backend detect_window_steps)
DETECTOR_OF_KIND = {
    "straggler": "straggler",
    "nan": "numerics",
    "loss_spike": "numerics",
    "slowdown": "slowdown",
    "comm_anomaly": "comm",
    "memory_pressure": "memory",
    "hang": "hang",
    "crash": "hang",
}

__all__ = [
    "DETECTOR_OF_KIND",
    "WINDOW",
    "Alert",
    "Baselines",
    "IncidentTracker",
    "Outcome",
    "ServerView",
    "Telemetry",
    "backend_window",
    "replay",
    "straggler_findings",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Batch = tuple[int, int, int]  # (rank, first chunk, end chunk): one rank's batch (or backlog)


@dataclass(frozen=True)
class Alert:
    """An incident the backend would open (or record as an episode already over).

    ``opened_step`` is the last finished step (training step id) when it opened and
    ``opened_time`` the tick's wall clock; ``fire_time`` (hang/crash only) the earliest
    ``now`` at which the detector returns it; ``detected_step`` (stragglers) the step at
    which the detector's persistence rule fired.
    """

    detector: str
    kind: str
    key: str
    ranks: tuple[int, ...]
    first_step: int | None
    opened_step: int | None
    opened_time: float
    active: bool = True
    fire_time: float | None = None
    detected_step: int | None = None
    ranks_later: tuple[int, ...] | None = None  # the incident's ranks at its last update
    component: str | None = None  # a slowdown's attribution (compute, comm, data)
    closed_time: float | None = None  # when its incident resolved; None: open at the end


@dataclass
class _Row:
    key: str
    kind: str
    first_step: int | None
    alert_index: int


class IncidentTracker:
    """``backend.incidents.service.apply_findings`` without a database.

    An active finding updates the open incident with its key or opens one; an inactive one
    resolves it, or is recorded as an already-resolved incident unless an incident with that
    key and first step exists; an open incident of a covered kind whose finding is gone is
    resolved. Every incident opened becomes an :class:`Alert`.
    """

    def __init__(self, covered: Iterable[str]) -> None:
        self.covered = frozenset(covered)
        self.open: dict[str, _Row] = {}
        self.rows: list[_Row] = []
        self.alerts: list[Alert] = []
        self.closed_at: dict[int, float] = {}  # alert index -> time its incident resolved
        self._latest: dict[int, tuple[int, ...]] = {}  # alert index -> ranks at last update

    def results(self) -> list[Alert]:
        """The alerts, each with the ranks its incident named at its last update and the
        time it resolved."""
        return [
            replace(a, ranks_later=self._latest.get(i, a.ranks), closed_time=self.closed_at.get(i))
            for i, a in enumerate(self.alerts)
        ]

    def named_since(self, ranks: npt.ArrayLike) -> FloatArray:
        """Per rank, the first step of its open straggler incident, NaN where it has none:
        what ``backend.detection.baselines.attach_named`` hands the detector."""
        rank_ids = np.asarray(ranks, dtype=np.int64)
        out = np.full(rank_ids.size, np.nan)
        since = {
            int(key.partition(":")[2]): row.first_step
            for key, row in self.open.items()
            if row.kind == "straggler" and row.first_step is not None
        }
        for i, rank in enumerate(rank_ids.tolist()):
            out[i] = since.get(rank, np.nan)
        return out

    def _known(self, key: str, first_step: int | None) -> bool:
        return any(
            r.key == key and (first_step is None or r.first_step == first_step) for r in self.rows
        )

    def apply(
        self,
        findings: Sequence[Finding],
        *,
        step: int | None,
        now: float,
        fire_time: float | None = None,
    ) -> None:
        seen: set[str] = set()
        for f in findings:
            seen.add(f.key)
            row = self.open.get(f.key)
            if row is None and not f.active and self._known(f.key, f.first_step):
                continue
            if row is None:
                row = self._open(f, step=step, now=now, fire_time=fire_time)
            self._latest[row.alert_index] = tuple(sorted(f.ranks))
            if f.first_step is not None and (
                row.first_step is None or f.first_step < row.first_step
            ):
                row.first_step = f.first_step
            if not f.active:
                self._close(f.key, now)
        for key, row in list(self.open.items()):
            if key not in seen and row.kind in self.covered:
                self._close(key, now)

    def _open(self, f: Finding, *, step: int | None, now: float, fire_time: float | None) -> _Row:
        detected = f.evidence.get("detected_step") if f.kind == "straggler" else None
        self.alerts.append(
            Alert(
                detector=DETECTOR_OF_KIND[f.kind],
                kind=f.kind,
                key=f.key,
                ranks=tuple(sorted(f.ranks)),
                first_step=f.first_step,
                opened_step=step,
                opened_time=now,
                active=f.active,
                fire_time=fire_time,
                detected_step=int(detected) if detected is not None else None,
                component=f.evidence.get("component"),
            )
        )
        row = _Row(
            key=f.key, kind=f.kind, first_step=f.first_step, alert_index=len(self.alerts) - 1
        )
        self.rows.append(row)
        self.open[f.key] = row
        return row

    def _close(self, key: str, now: float) -> None:
        row = self.open.pop(key)
        self.closed_at[row.alert_index] = now


class Baselines:
    """``backend.detection.baselines`` without a store: each rank's normal ratio, learned
    from the first window that allows it (``learn_baselines``: at least ``learn_steps``
    steps, the rank in half of them) and kept for the rest of the job."""

    def __init__(self, world_size: int) -> None:
        self.values = np.full(world_size, np.nan)

    def attach(self, window: StepWindow) -> StepWindow:
        """``window`` with ``straggler_baseline`` filled, learning the ranks not known yet."""
        base = self.values[window.ranks]
        todo = ~np.isfinite(base)
        if todo.any():
            comm = window.comm_time if window.has_comm else None
            learned = learn_baselines(window.steps, window.step_time, comm)
            new = todo & np.isfinite(learned)
            self.values[window.ranks[new]] = learned[new]
            base[new] = learned[new]
        return dataclasses.replace(window, straggler_baseline=base)


def backend_window(
    keeper: Baselines,
    *,
    steps: npt.ArrayLike,
    ranks: npt.ArrayLike,
    step_time: npt.ArrayLike,
    comm_time: npt.ArrayLike | None = None,
    live_ranks: int,
    incidents: IncidentTracker | None = None,
) -> StepWindow:
    """The step window a detection run judges (``backend.detection.runner.detect_job``): the
    steps enough live ranks have reported, with each rank's carried baseline and the step
    its open straggler incident (in ``incidents``) names it from. Empty (no steps) when
    nothing is settled yet; baselines are then not touched."""
    window = settled(
        StepWindow.from_arrays(steps=steps, ranks=ranks, step_time=step_time, comm_time=comm_time),
        live_ranks=live_ranks,
    )
    if not window.steps.size:
        return window
    window = keeper.attach(window)
    if incidents is None:
        return window
    return dataclasses.replace(window, straggler_since=incidents.named_since(window.ranks))


def straggler_findings(window: StepWindow) -> list[Finding]:
    """The straggler detector on ``window`` as the backend runs it: its registration
    (``detectors.registry``), which reads the carried baselines and named ranks."""
    [detector] = [d for d in registry.detectors() if d.name == "straggler"]
    return detector.detect(Window(steps=window))


@dataclass(frozen=True)
class Telemetry:
    """A job's step records as collectors ship them, with the ground truth.

    ``chunk`` steps of one rank make one batch (one collector flush); ``truth`` are the ranks
    a straggler detector should name, from step id ``onset`` on.
    """

    name: str
    steps: IntArray  # (S,) step ids
    step_time: FloatArray  # (R, S)
    comm_time: FloatArray | None  # (R, S), None: the job reports no collective waits
    chunk: int
    truth: frozenset[int]
    onset: int

    @property
    def n_ranks(self) -> int:
        return int(self.step_time.shape[0])

    @property
    def n_chunks(self) -> int:
        return -(-int(self.steps.size) // self.chunk)

    def position(self, step: int) -> int:
        """Index of step id ``step`` among the job's steps (onsets compare in steps)."""
        return int(np.searchsorted(self.steps, step))


class ServerView:
    """What the server holds of a job as batches land: ``load_steps``'s window over it."""

    def __init__(self, job: Telemetry) -> None:
        self.job = job
        self.arrived = np.zeros(job.step_time.shape, dtype=bool)

    def land(self, batch: Batch) -> None:
        rank, first, end = batch
        self.arrived[rank, first * self.job.chunk : end * self.job.chunk] = True

    def window(
        self, width: int = WINDOW
    ) -> tuple[IntArray, IntArray, FloatArray, FloatArray | None] | None:
        """(steps, ranks, step_time, comm_time) of the last ``width`` step ids any rank has
        reported, the ranks with a record among them, NaN where a batch is not in yet."""
        cols = np.flatnonzero(self.arrived.any(axis=0))[-width:]
        if not cols.size:
            return None
        sub = self.arrived[:, cols]
        rows = np.flatnonzero(sub.any(axis=1))
        mask, grid = sub[rows], np.ix_(rows, cols)
        job = self.job
        times = np.where(mask, job.step_time[grid], np.nan)
        comm = None if job.comm_time is None else np.where(mask, job.comm_time[grid], np.nan)
        return job.steps[cols], rows, times, comm


@dataclass
class Outcome:
    """What a replay opened: for each rank named, the onset (first step) of every straggler
    incident; detection runs, how many held steps back (``settled``), and their cost."""

    opened: dict[int, list[int]] = field(default_factory=dict)
    runs: int = 0
    held: int = 0
    seconds: float = 0.0
    alerts: list[Alert] = field(default_factory=list)

    @property
    def flaps(self) -> int:
        """Incidents opened again for a rank already named: a notification each time."""
        return sum(len(v) - 1 for v in self.opened.values())

    def onset(self, rank: int) -> int:
        return min(self.opened[rank])


def replay(
    job: Telemetry, batches: Iterable[Batch], *, per_run: int, width: int = WINDOW
) -> Outcome:
    """Deliver ``batches`` in order; after every ``per_run`` of them (and after the last),
    one detection run as ``backend.detection.runner.detect_job`` makes it for the straggler
    detector: the settled window (every rank live: collectors beat apart from their
    telemetry), carried baselines, findings into incidents."""
    view, keeper = ServerView(job), Baselines(job.n_ranks)
    tracker = IncidentTracker({"straggler"})
    out = Outcome()
    pending = 0
    for batch in batches:
        view.land(batch)
        pending += 1
        if pending == per_run:
            _detect(view, keeper, tracker, out, width)
            pending = 0
    if pending:
        _detect(view, keeper, tracker, out, width)
    out.alerts = tracker.results()
    for a in out.alerts:
        out.opened.setdefault(a.ranks[0], []).append(int(a.first_step or 0))
    return out


def _detect(
    view: ServerView, keeper: Baselines, tracker: IncidentTracker, out: Outcome, width: int
) -> None:
    seen = view.window(width)
    if seen is None:
        return
    start = time.perf_counter()
    steps, ranks, times, comm = seen
    window = backend_window(
        keeper,
        steps=steps,
        ranks=ranks,
        step_time=times,
        comm_time=comm,
        live_ranks=view.job.n_ranks,
        incidents=tracker,
    )
    out.runs += 1
    out.held += int(window.steps.size < steps.size)
    if window.steps.size:  # nothing settled: the run has no step window (no change)
        findings = straggler_findings(window)
        tracker.apply(findings, step=int(window.steps[-1]), now=float(out.runs))
    out.seconds += time.perf_counter() - start

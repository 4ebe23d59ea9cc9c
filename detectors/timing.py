"""Compute time: the part of a step that a rank spent on its own work.

    >>> import numpy as np
    >>> from detectors.timing import compute_time
    >>> step_s = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])   # (ranks, steps)
    >>> comm_s = np.array([[0.6, 0.6, 0.6], [0.6, 0.1, np.nan]])
    >>> compute_time(step_s, comm_s)          # rank 1 turned slow; its last wait is unknown
    array([[0.4, 0.4, 0.4],
           [0.4, 0.9, 1. ]])
    >>> compute_time([0.5, 0.7], [0.2, None])   # a step event without comm_s
    array([0.3, 0.7])
    >>> compute_time([0.5, 0.7])                # a job that reports no collective time
    array([0.5, 0.7])

**Definition.** ``compute time = step time − time in collectives`` (``duration_s - comm_s``
of a step record); a missing collective time (not measured: ``None``, or ``NaN`` in an
array, ``NULL`` in the store) counts as 0, so the compute time is then the step time. (The
straggler detector leaves such a step out of its comparison where the other ranks' waits
are known: see :mod:`detectors.straggler`.)

Why: in synchronous training every step ends in collectives that wait for the slowest rank,
so all ranks show the same step time, and the slow rank is the one that *waits least*. Step
time minus collective wait is the work a rank did itself, the number that sets a slow rank
apart (the heatmap, the rollups' ``sum_compute``, the straggler detector, an incident's
evidence chart).

Waiting for the data loader (``data_s``) is part of compute time: it is time the rank spent
on its own, not waiting for the others, and a rank stalled on its input slows the job like
any other straggler. A caller that wants the model's work alone subtracts it: the slowdown
detector (:mod:`detectors.slowdown`) splits a step three ways, ``comm``, ``data`` and
``compute = compute_time(step, comm) - data``, to tell an input stall from slower math.

The store computes the same number in SQL with
:func:`backend.telemetry.timing.compute_time_sql` (``duration_s - coalesce(comm_s, 0)``);
a test checks that the two agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["compute_time"]


def compute_time(
    step_s: npt.ArrayLike, comm_s: npt.ArrayLike | Sequence[float | None] | None = None
) -> npt.NDArray[np.float64]:
    """``step_s - comm_s`` as a new float64 array, a missing ``comm_s`` (``None``, as a whole
    or in a list, or NaN) counting as 0.

    The two broadcast against each other; a NaN ``step_s`` stays NaN (nothing was reported).
    """
    step = np.asarray(step_s, dtype=np.float64)
    if comm_s is None:
        return step.copy()
    comm = np.asarray(comm_s, dtype=np.float64)
    return np.asarray(step - np.where(np.isnan(comm), 0.0, comm), dtype=np.float64)

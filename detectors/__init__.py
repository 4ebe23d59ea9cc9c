"""Pure detection algorithms: arrays in, findings out. No database, clock or network.

One module per detector, each registering itself with :mod:`detectors.registry` (a name,
the incident kinds it can produce, the window parts it needs); all return
``detectors.finding.Finding``. The backend builds a :class:`detectors.window.Window` from
the store (``backend/detection``), runs the registry over it, and turns findings into
incidents. ``tests/detectors/test_purity.py`` keeps this package free of I/O.
"""

from detectors.finding import KINDS, Finding

__all__ = ["KINDS", "Finding"]

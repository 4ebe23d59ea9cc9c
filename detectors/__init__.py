"""Pure detection algorithms: arrays in, findings out. No database, clock or network.

One module per detector; all return ``detectors.finding.Finding``. The backend gathers the
arrays (``backend/detection``), calls the detectors, and turns findings into incidents.
"""

from detectors.finding import KINDS, Finding

__all__ = ["KINDS", "Finding"]

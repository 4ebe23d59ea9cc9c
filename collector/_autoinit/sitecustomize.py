"""Started by ``vigil run``: initialise the collector in the launched Python processes.

``vigil run`` puts this folder on PYTHONPATH, so Python imports this module at start-up.
``VIGIL_AUTOINIT=ranks`` initialises only processes that torchrun started as ranks (they
have ``RANK``), not the launcher itself; ``VIGIL_AUTOINIT=1`` initialises the first Python
process. Processes those start (DataLoader workers, …) are left alone. Any other
``sitecustomize`` further along the path still runs.
"""

import os
import sys


def _autoinit() -> None:
    mode = os.environ.get("VIGIL_AUTOINIT", "")
    if not mode or os.environ.get("VIGIL_AUTOINIT_DONE"):
        return
    if mode == "ranks" and "RANK" not in os.environ:
        return
    os.environ["VIGIL_AUTOINIT_DONE"] = str(os.getpid())
    try:
        import collector

        collector.init()
    except Exception as exc:  # never break the user's program
        sys.stderr.write(f"vigil: auto-init failed: {exc}\n")


def _chain() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_autoinit()
_chain()

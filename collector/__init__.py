"""Vigil's in-process collector: ``import collector as vigil``.

It is a guest in someone else's process: standard library only (torch when the job has
it), never imports the backend, never raises into user code, never blocks a step.
The hooks (step timing, collectives, heartbeats, shipping) build on ``Config``.
"""

from collector.config import Config

__all__ = ["Config"]
__version__ = "0.1.0"

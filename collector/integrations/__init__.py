"""Integrations with PyTorch, one module each, each with an idempotent ``setup_once()``.

They patch or hook module-level entry points once per process and find the live client
through ``collector.get_client()`` at call time, so a second ``init()`` needs no re-patching
and a process that never calls ``init()`` pays one ``None`` check per hooked call.
"""

from __future__ import annotations

import importlib
import logging

from collector.client import Client

log = logging.getLogger("vigil.collector")

INTEGRATIONS = (
    "collector.integrations.optimizer",
    "collector.integrations.dataloader",
    "collector.integrations.torch_distributed",
    "collector.integrations.opseq",
)


def setup_integrations(client: Client) -> list[str]:
    """Install every integration whose library is importable; returns the installed ones."""
    try:
        import torch  # noqa: F401
    except ImportError:
        log.info("vigil: torch not importable; only explicit vigil.step() timing is active")
        return []
    installed = []
    for name in INTEGRATIONS:
        try:
            module = importlib.import_module(name)
            module.setup_once(client)
            installed.append(name.rsplit(".", 1)[1])
        except Exception:
            log.warning("vigil: integration %s failed to install; skipping it", name, exc_info=True)
    return installed

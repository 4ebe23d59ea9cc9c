"""``data_s``: time the training loop spends waiting in ``next()`` on a torch DataLoader."""

from __future__ import annotations

import functools
import time
from typing import Any

_installed = False


def setup_once(client: Any) -> None:
    global _installed
    if _installed:
        return
    from torch.utils.data import dataloader

    iterator = dataloader._BaseDataLoaderIter
    original = iterator.__next__

    @functools.wraps(original)
    def timed_next(self: Any) -> Any:
        from collector import get_client

        started = time.perf_counter()
        try:
            return original(self)
        finally:
            active = get_client()
            if active is not None:
                active.add_data_wait(time.perf_counter() - started)

    iterator.__next__ = timed_next  # type: ignore[method-assign]
    _installed = True

"""Step boundaries from PyTorch's global optimizer hooks, for scripts that do not call
``vigil.step``; and the ``nan`` chaos fault, which poisons gradients before an update."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("vigil.collector")
_installed = False


def setup_once(client: Any) -> None:
    global _installed
    if _installed:
        return
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    register_optimizer_step_pre_hook(_pre_hook)
    register_optimizer_step_post_hook(_post_hook)
    _installed = True


def _pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    from collector import get_client

    client = get_client()
    if client is None or not client.chaos:
        return
    try:
        if client.chaos.poison_gradients(client.current_step):
            log.warning("vigil chaos: NaN gradients at step %s", client.current_step)
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.fill_(float("nan"))
    except Exception:
        log.debug("vigil: chaos pre-hook failed", exc_info=True)


def _post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    from collector import get_client

    client = get_client()
    if client is None:
        return
    try:
        client.tick_optimizer_step()
    except Exception:
        log.debug("vigil: optimizer hook failed", exc_info=True)

"""The dispatch-mode and saved-tensor-hook stacks: put a mode or hooks of ours under or
among the user's, and take them out again, without disturbing theirs."""

from __future__ import annotations

from typing import Any


def _infra_mode_active() -> bool:
    import torch

    keys = torch._C._TorchDispatchModeKey
    return any(
        torch._C._get_dispatch_mode(k) is not None for k in (keys.FAKE, keys.PROXY, keys.FUNCTIONAL)
    )


def _insert_bottom(mode: Any) -> None:
    """Push ``mode`` under the user's modes, so their ``__exit__`` still pops their own."""
    import torch

    c = torch._C
    above = [c._pop_torch_dispatch_stack(None) for _ in range(c._len_torch_dispatch_stack())]
    c._push_on_torch_dispatch_stack(mode)
    for m in reversed(above):
        c._push_on_torch_dispatch_stack(m)
    _sync_mode_flags()


def _remove(mode: Any) -> None:
    """Take ``mode`` off the stack wherever it is, keeping the others in order."""
    import torch

    c = torch._C
    above = []
    found = False
    for _ in range(c._len_torch_dispatch_stack()):
        m = c._pop_torch_dispatch_stack(None)
        if m is mode:
            found = True
            break
        above.append(m)
    for m in reversed(above):
        c._push_on_torch_dispatch_stack(m)
    _sync_mode_flags()
    if not found:
        raise RuntimeError("vigil's dispatch mode was popped by someone else")


def _sync_mode_flags() -> None:
    """``TorchDispatchMode.__enter__`` keeps module flags saying whether any mode is active
    (torch.compile reads them); set them from the stack as it is now."""
    from torch.utils import _python_dispatch as pd

    stack = pd._get_current_dispatch_mode_stack()
    pd._is_in_torch_dispatch_mode = bool(stack)
    pd._is_in_non_infra_torch_dispatch_mode = any(not m.is_infra_mode() for m in stack)
    without = any(not m.ignore_compile_internals() for m in stack)
    pd._is_in_any_mode_without_ignore_compile_internals = without
    setter = getattr(pd, "set_is_in_mode_without_ignore_compile_internals", None)
    if setter is not None:
        setter(without)


def _remove_saved_hooks(pack: Any) -> None:
    """Pop our saved-tensor hooks, re-pushing any the user pushed on top and kept."""
    import torch

    autograd = torch._C._autograd
    above = []
    while True:
        top = autograd._top_saved_tensors_default_hooks(True)
        if top is None:
            break
        autograd._pop_saved_tensors_default_hooks()
        if top[0] is pack:
            break
        above.append(top)
    for p, u in reversed(above):
        autograd._push_saved_tensors_default_hooks(p, u)

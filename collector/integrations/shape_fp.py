"""The cheap structural fingerprint of a step: which modules ran, on what shapes.

A global ``nn.Module`` forward hook (no change to the user's code, no model handle needed)
records, for every module call on the step's thread, the module's class name, the shapes
of its tensor arguments (positional and keyword) and of a tensor output. At the end of the
step the list is hashed (16 hex digits of blake2b) into the step record's ``shape_fp``:

    {"type": "step", "step": 31, ..., "shape_fp": "4be0a1c2d3e4f506"}

Same model, same shapes → same ``shape_fp``; a new sequence length, batch size, MoE
routing that changes an expert's input, or a different set of modules → a new one. The
op-sequence integration runs the full aten capture on the step after a ``shape_fp`` it has
not captured yet, so a change is seen at once instead of at the next sampled step.

Cost: the hook is registered once, when the first step starts, and stays registered (so
``torch.compile`` sees one constant set of hooks and never recompiles for ours); outside a
step it returns at the first check. Registering any global hook moves every module call
off ``Module._call_impl``'s no-hook fast path; ``bench/collector_overhead.py`` measures the
whole (see bench/README.md). Inside ``torch.compile``'d regions the hook returns at once
(the compiled module's own outer call is still recorded). Functional code outside modules
is not seen: a model without modules has a constant ``shape_fp`` and relies on the
sampling period.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Any

log = logging.getLogger("vigil.collector")

# Items (classes and shapes) recorded per step (the hash still covers the count of calls).
MAX_ITEMS = 200_000
MAX_KNOWN = 256  # distinct shape sets remembered (the cache is emptied past it)


class ShapeRecorder:
    """One per process: the global hook writes into ``items`` while a step records."""

    def __init__(self) -> None:
        self.items: list[Any] | None = None
        self.calls = 0
        self.thread = 0
        self.installed = False
        self.failed = False
        # A step's items → (fingerprint, calls): steady steps hash a tuple, in C.
        self.known: dict[tuple[Any, ...], tuple[str, int]] = {}
        # The profiler's module stack: it gets every module entered and left while it runs.
        self.owner: Any = None
        self.handles: list[Any] = []

    def install(self) -> bool:
        if self.installed or self.failed:
            return self.installed
        try:
            import torch
            from torch.nn.modules.module import (
                register_module_forward_hook,
                register_module_forward_pre_hook,
            )

            tensor = torch.Tensor
            compiling = torch.compiler.is_compiling
            get_ident = threading.get_ident
            rec = self

            def enter(module: Any, args: Any) -> None:
                if compiling():  # first: a traced hook must not guard on our state
                    return
                owner = rec.owner
                if owner is not None:
                    try:
                        owner.enter_module(module)
                    except Exception:
                        rec.owner = None  # this capture goes on without module paths
                        log.debug("vigil: module path failed", exc_info=True)

            def hook(module: Any, args: Any, kwargs: Any, output: Any) -> None:
                if compiling():
                    return
                owner = rec.owner
                if owner is not None:
                    try:
                        owner.leave_module(module)
                    except Exception:
                        rec.owner = None
                        log.debug("vigil: module path failed", exc_info=True)
                items = rec.items
                if items is None or get_ident() != rec.thread:
                    return
                # Raw, cheap objects here (the class, ``torch.Size``); ``stop`` hashes them.
                try:
                    if len(items) >= MAX_ITEMS:
                        rec.calls += 1
                        return
                    items.append(type(module))
                    for a in args:
                        if isinstance(a, tensor):
                            items.append(a.shape)
                    if kwargs:
                        for k, a in kwargs.items():
                            if isinstance(a, tensor):
                                items.append(k)
                                items.append(a.shape)
                    if isinstance(output, tensor):
                        items.append(None)  # the output's shape follows
                        items.append(output.shape)
                except Exception:
                    rec.items = None
                    log.debug("vigil: shape fingerprint failed this step", exc_info=True)

            # Both stay registered: torch.compile guards on the number of global hooks.
            self.handles = [
                register_module_forward_pre_hook(enter),
                register_module_forward_hook(hook, with_kwargs=True, always_call=True),
            ]
            self.installed = True
        except Exception:
            self.failed = True
            log.warning("vigil: module hooks unavailable; no per-step shape fingerprint")
        return self.installed

    def uninstall(self) -> None:
        """Remove the hooks (the overhead benchmark's bare mode; the next step adds them)."""
        for handle in self.handles:
            handle.remove()
        self.handles, self.installed, self.items, self.owner = [], False, None, None

    def start(self) -> None:
        if not self.install():
            return
        self.calls = 0
        self.thread = threading.get_ident()
        self.items = []

    def stop(self) -> str | None:
        """The step's fingerprint, or None where recording did not run or failed."""
        items, self.items = self.items, None
        if items is None or threading.get_ident() != self.thread:
            return None
        key = (tuple(items), self.calls)
        known = self.known.get(key)
        if known is None:
            # repr is stable across processes (a class prints its module and name, a size
            # its numbers, never an address); ~10 µs a hundred calls, so once per shape set.
            calls = self.calls + sum(1 for x in items if isinstance(x, type))
            digest = hashlib.blake2b(repr(items).encode(), digest_size=8)
            digest.update(b"#%d" % calls)
            known = (digest.hexdigest(), calls)
            if len(items) <= 20_000:  # the cache's memory stays bounded
                if len(self.known) >= MAX_KNOWN:
                    self.known.clear()
                self.known[key] = known
        self.calls = known[1]
        return known[0]


RECORDER = ShapeRecorder()

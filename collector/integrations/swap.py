"""Apply an activation-swap policy (``detectors.swap.generate``) in the training process.

    executor = SwapExecutor()
    executor.set_policy(policy)              # takes effect when the next step starts
    for batch in loader:
        with executor.step():                # or on_step_start(step) / on_step_end(step)
            loss = model(batch).sum()
            loss.backward()
        report = executor.last               # {"policy_version", "peak_bytes", "skipped", …}

During a step with a policy, ``torch.autograd.graph`` saved-tensor hooks see every tensor
autograd saves. Storages are numbered in order of first pack, as the profiler numbers them
(``collector.integrations.profile``); views that share one storage (q, k, v cut from one
projection) are one storage: it is copied out once and each view is rebuilt on it with its
own offset, shape and strides, so backward computes on bit-identical data. A storage the
policy offloads is copied to host memory when first packed (CUDA: pinned memory, on a side
stream, ordered by events; elsewhere a real synchronous copy into a separate buffer). When
backward unpacks storage ``s``, every offloaded storage whose ``prefetch_at`` is at or
before ``s``'s first consumer is copied back (CUDA: issued on the side stream); unpacking an
offloaded storage waits for its copy (or fetches it then, counted as late).

A policy is checked while the step runs: a storage whose bytes differ from the policy's
``storage_bytes`` at its id, or more storages than it names, means the policy was made
for another op sequence. From there on nothing more is offloaded (what was already is still
restored exactly), the step is reported ``skipped`` and counted. Policies switch only at
step boundaries. Any failure in the hooks switches the policy off for the rest of the step
and is counted; the hooks never raise into the training step (except where a storage that
was offloaded cannot be brought back at all: wrong gradients would be worse).

Memory is accounted as ``detectors.swap.simulate`` models it: the policy's ``base_bytes``
plus every non-parameter saved storage on the device, from its first pack until autograd
releases its last saved tensor, less the time it spends offloaded. On CPU, where copies are
synchronous, the measured peak equals the simulator's prediction at infinite bandwidth. On
CUDA the step also reports ``cuda_peak_bytes`` (``torch.cuda.max_memory_allocated``).

Cost: a step without a policy pays nothing (no hooks), unless the executor accounts every
step (``SwapExecutor(account=True)``, what the collector does on CPU: the same hooks, nothing
offloaded). With hooks, each saved tensor costs a pack and an unpack in Python (about
5–10 µs together on a slow CPU; ``bench/swap_policy.py``) plus the copies of what is
offloaded. In a training job the collector drives it (``collector.integrations.swap_loop``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from collector.integrations.swap_cuda import CudaCopies as _Streams
from collector.integrations.swap_step import _Handle, _Policy, _Step

log = logging.getLogger("vigil.collector")

__all__ = ["SwapExecutor", "check_policy"]


def check_policy(policy: Any) -> int:
    """Check that the executor can read ``policy``; returns its version. A ValueError says
    what is wrong (a missing key, lists of different lengths, an entry that does not fit)."""
    return _parse(policy).version


def _parse(policy: Any) -> _Policy:
    if not isinstance(policy, dict):
        raise ValueError(f"a policy must be a dict, not {type(policy).__name__}")
    try:
        return _Policy(policy)
    except KeyError as exc:
        raise ValueError(f"the policy has no {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the policy cannot be read: {exc}") from None


def _pack(executor: SwapExecutor, t: Any) -> Any:
    state = executor._state
    if state is None or state.failed:
        return t
    try:
        return state.pack(t)
    except Exception:
        state.failed = True
        executor.counts["failed"] += 1
        log.warning("vigil: swap policy off for this step", exc_info=True)
        return t.detach()


def _unpack(packed: Any) -> Any:
    if type(packed) is not _Handle:
        return packed
    state = packed.state
    try:
        return state.unpack(packed)
    except Exception:
        log.warning("vigil: swap restore failed; copying back synchronously", exc_info=True)
        state.failed = True
        if packed.meta is None:
            return packed.tensor
        g = packed.group
        dev = g.host.to(g.device)  # the last resort; if this fails, backward must fail
        dtype, shape, stride, offset = packed.meta
        return state.torch.empty(0, dtype=dtype, device=g.device).set_(
            dev.untyped_storage(), offset, shape, stride
        )


class SwapExecutor:
    """Applies swap policies, one step at a time (see the module docstring).

    ``account=True``: steps without a policy are accounted too (the hooks run, nothing is
    offloaded), so every step reports ``peak_bytes``: ``base_bytes`` (set by the caller:
    parameters, gradients, optimizer state) plus the saved storages' peak. The collector
    uses it on CPU, where this account is the step's device memory."""

    def __init__(self, *, account: bool = False) -> None:
        self.account = account
        self.base_bytes = 0  # without a policy; with one, the policy's ``base_bytes``
        # Without a policy: storages of parameters and buffers (data pointers) not counted,
        # as a profile marks them ``param`` (set by the caller from a profile capture).
        self.param_ptrs: frozenset[int] = frozenset()
        self._pending: tuple[_Policy | None] | None = None  # set_policy, not yet applied
        self._policy: _Policy | None = None
        self._state: _Step | None = None
        self._hooks: tuple[Any, Any] | None = None
        self._streams: _Streams | None = None
        self._lock = threading.Lock()
        self.counts = {
            "steps": 0,
            "applied": 0,
            "accounted": 0,
            "skipped": 0,
            "failed": 0,
            "rejected": 0,
        }
        self.last: dict[str, Any] | None = None  # the report of the last step

    @property
    def version(self) -> int | None:
        """The version of the policy in force (None: none)."""
        return None if self._policy is None else self._policy.version

    def set_policy(self, policy: dict[str, Any] | None) -> bool:
        """Use ``policy`` from the next step on (None: stop swapping). A policy that cannot be
        read is refused (False, counted) and the one in force stays."""
        try:
            parsed = None if policy is None else _parse(policy)
        except Exception:
            self.counts["rejected"] += 1
            log.warning("vigil: swap policy refused", exc_info=True)
            return False
        with self._lock:
            self._pending = (parsed,)
        return True

    def on_step_start(self, step: int | None = None) -> None:
        try:
            self._start()
        except Exception:
            self.counts["failed"] += 1
            self._state = None
            log.warning("vigil: swap executor could not start the step", exc_info=True)

    def _start(self) -> None:
        if self._state is not None:  # the previous step did not end
            self._finish()
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            self._policy = pending[0]
        if self._policy is None and not self.account:
            return
        import torch

        autograd = torch._C._autograd
        if autograd._top_saved_tensors_default_hooks(True) is not None:
            # The user's own hooks (checkpointing, save_on_cpu) or a profiling capture:
            # theirs win; this step runs without the policy.
            self.counts["skipped"] += 1
            return
        if self._streams is None and torch.cuda.is_available():
            self._streams = _Streams(torch)
            torch.cuda.reset_peak_memory_stats()
        elif self._streams is not None:
            torch.cuda.reset_peak_memory_stats()
        self._state = _Step(self._policy, torch, self._streams, self.param_ptrs)
        pack = self._hook_pack
        autograd._push_saved_tensors_default_hooks(pack, _unpack)
        self._hooks = (pack, _unpack)

    def _hook_pack(self, t: Any) -> Any:
        return _pack(self, t)

    def on_step_end(self, step: int | None = None) -> dict[str, Any]:
        try:
            report = self._finish()
        except Exception:
            self.counts["failed"] += 1
            self._state = None
            log.warning("vigil: swap executor could not end the step", exc_info=True)
            report = {"policy_version": self.version, "peak_bytes": None, "skipped": True}
        self.last = report
        return report

    def _finish(self) -> dict[str, Any]:
        state, self._state = self._state, None
        if self._hooks is not None:
            from collector.integrations.opseq import _remove_saved_hooks

            pack, self._hooks = self._hooks[0], None
            _remove_saved_hooks(pack)
        policy = self._policy
        if state is None:
            return {"policy_version": self.version, "peak_bytes": None, "skipped": True}
        self.counts["steps"] += 1
        p = state.policy
        skipped = p is not None and (state.mismatch or len(state.groups) != len(p.sizes))
        self.counts["accounted" if p is None else "skipped" if skipped else "applied"] += 1
        if state.failed:
            self.counts["failed"] += 1
        report: dict[str, Any] = {
            "policy_version": None if policy is None else policy.version,
            "peak_bytes": (p.base if p is not None else self.base_bytes) + state.peak,
            "saved_peak_bytes": state.peak,
            "skipped": skipped,
            "failed": state.failed,
            "storages": len(state.groups),
            "offloaded": state.offloaded,
            "offloaded_bytes": state.offloaded_bytes,
            "late_prefetches": state.late,
        }
        if self._streams is not None:
            report["cuda_peak_bytes"] = int(state.torch.cuda.max_memory_allocated())
        return report

    @contextlib.contextmanager
    def step(self, step: int | None = None) -> Iterator[None]:
        """``with executor.step(): loss.backward()`` — one step; the report is ``.last``."""
        self.on_step_start(step)
        try:
            yield
        finally:
            self.on_step_end(step)

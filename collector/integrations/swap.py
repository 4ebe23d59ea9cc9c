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

Cost: a step without a policy pays nothing (no hooks). With one, each saved tensor costs a
pack and an unpack in Python (about 5–10 µs together on a slow CPU; ``bench/swap_policy.py``)
plus the copies of what is offloaded.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from collector.integrations.swap_cuda import CudaCopies as _Streams

log = logging.getLogger("vigil.collector")

__all__ = ["SwapExecutor"]


class _Policy:
    """The parts of a POLICY the executor needs, checked once."""

    def __init__(self, policy: dict[str, Any]) -> None:
        self.version = int(policy.get("version", 0))
        self.sizes = [int(b) for b in policy["storage_bytes"]]
        self.consumers = [int(c) if c is not None else -1 for c in policy["consumers"]]
        if len(self.consumers) != len(self.sizes):
            raise ValueError("consumers and storage_bytes differ in length")
        self.params = {int(s) for s in policy.get("params", ())}
        self.base = int(policy.get("base_bytes", 0))
        self.offload: dict[int, int] = {}
        for e in policy.get("offload", ()):
            s = int(e["storage"])
            if not 0 <= s < len(self.sizes) or int(e["bytes"]) != self.sizes[s]:
                raise ValueError(f"offload entry for storage {s} does not match storage_bytes")
            self.offload[s] = int(e["prefetch_at"])


class _Group:
    """One saved storage in this step."""

    __slots__ = (
        "alive",
        "counted",
        "dev",
        "device",
        "host",
        "id",
        "in_event",
        "nbytes",
        "out_event",
        "resident",
        "version",
    )

    def __init__(self, gid: int, nbytes: int, counted: bool, device: Any) -> None:
        self.id, self.nbytes, self.counted, self.device = gid, nbytes, counted, device
        self.alive = 0  # saved tensors (handles) of this storage autograd still holds
        self.resident = True
        self.host: Any = None  # the host copy, while offloaded
        self.dev: Any = None  # the storage on the device after the copy back
        self.version = -1
        self.out_event: Any = None
        self.in_event: Any = None


class _Handle:
    """What autograd keeps for one saved tensor: the tensor, or how to rebuild it."""

    __slots__ = ("group", "meta", "state", "tensor")

    def __init__(self, state: _Step, group: _Group, tensor: Any, meta: Any) -> None:
        self.state, self.group, self.tensor, self.meta = state, group, tensor, meta
        group.alive += 1

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.state.release(self.group)


class _Step:
    """One step under a policy: its storages, offloads, prefetches and memory account."""

    def __init__(self, policy: _Policy | None, torch: Any, streams: _Streams | None) -> None:
        self.policy = policy
        self.torch = torch
        self.streams = streams
        self.groups: list[_Group] = []
        self.by_storage: dict[int, _Group] = {}
        self.pins: list[Any] = []
        self.weakref_type: Any = _storage_weakref()
        self.mismatch = policy is None
        self.failed = False
        self.resident = self.peak = 0
        self.offloaded = self.offloaded_bytes = self.late = 0
        # Prefetches not yet issued, in issue order: by prefetch op, then first needed.
        offload = policy.offload if policy is not None else {}
        consumers = policy.consumers if policy is not None else []
        order = sorted((pa, consumers[s], s) for s, pa in offload.items())
        self.queue = [(pa, s) for pa, _, s in order]
        self.next = 0

    # -- pack (forward) ------------------------------------------------------------------

    def pack(self, t: Any) -> Any:
        try:
            storage = t.untyped_storage()
            key = storage._cdata
        except Exception:  # no storage (sparse, nested, a wrapper subclass): kept as it is
            storage, key = None, None
        g = self.by_storage.get(key) if key is not None else None
        if g is None or g.alive == 0:  # a storage whose saved tensors all died is new
            if storage is None:
                g = self._new_group(t, t.numel() * t.element_size())
            else:
                g = self._new_group(t, storage.nbytes())
                if storage.data_ptr():  # as the profiler does: empty storages stay apart
                    # A weak reference keeps the storage's address from being reused by
                    # another storage during the step, so the address identifies it.
                    self.pins.append(self.weakref_type(storage))
                    self.by_storage[key] = g
        if storage is None:
            return _Handle(self, g, t.detach(), None)
        if g.host is not None or g.dev is not None:  # offloaded: keep only how to rebuild
            if t._version != g.version:  # written since the copy: copy again
                self._copy_out(g, storage, t._version)
            meta = (t.dtype, tuple(t.shape), t.stride(), t.storage_offset())
            return _Handle(self, g, None, meta)
        handle = _Handle(self, g, t.detach(), None)
        if self._should_offload(g):
            self._copy_out(g, storage, t._version)
            handle.tensor = None
            handle.meta = (t.dtype, tuple(t.shape), t.stride(), t.storage_offset())
        return handle

    def _new_group(self, t: Any, nbytes: int) -> _Group:
        gid = len(self.groups)
        p = self.policy
        if p is not None and not self.mismatch and (gid >= len(p.sizes) or p.sizes[gid] != nbytes):
            self.mismatch = True
            log.info("vigil: swap policy %s does not fit this step; skipped", p.version)
        if p is not None and not self.mismatch:
            counted = gid not in p.params
        else:
            base = t._base if t._base is not None else t
            counted = not (base.is_leaf and base.requires_grad)
        g = _Group(gid, nbytes, counted, t.device)
        self.groups.append(g)
        self._add(g)
        return g

    def _should_offload(self, g: _Group) -> bool:
        p = self.policy
        return p is not None and not (self.mismatch or self.failed) and g.id in p.offload

    def _copy_out(self, g: _Group, storage: Any, version: int) -> None:
        torch = self.torch
        src = torch.empty(0, dtype=torch.uint8, device=g.device).set_(storage)
        if self.streams is not None and src.is_cuda:
            host = torch.empty(g.nbytes, dtype=torch.uint8, pin_memory=True)
            self.streams.copy(host, src, g, out=True)
        else:
            host = src.clone()  # a real copy, into a separate buffer
        if g.host is None and g.dev is None:
            self.offloaded += 1
            self.offloaded_bytes += g.nbytes
        g.host, g.dev, g.version = host, None, version
        if g.resident:
            g.resident = False
            if g.counted:
                self.resident -= g.nbytes

    # -- unpack (backward) ---------------------------------------------------------------

    def unpack(self, h: _Handle) -> Any:
        g = h.group
        if self.policy is not None and not self.mismatch and g.id < len(self.policy.consumers):
            self._trigger(self.policy.consumers[g.id])
        if h.meta is None:
            return h.tensor
        if g.dev is None:  # not prefetched (late, or the policy was dropped): fetch now
            self.late += 1
            self._fetch(g)
        dev = g.dev
        if self.streams is not None and g.in_event is not None:
            self.streams.wait(g.in_event, dev)
        dtype, shape, stride, offset = h.meta
        return self.torch.empty(0, dtype=dtype, device=g.device).set_(
            dev.untyped_storage(), offset, shape, stride
        )

    def _trigger(self, consumer: int) -> None:
        queue = self.queue
        while self.next < len(queue) and queue[self.next][0] <= consumer:
            s = queue[self.next][1]
            self.next += 1
            if s < len(self.groups):
                g = self.groups[s]
                if g.dev is None and g.host is not None and g.alive > 0:
                    try:
                        self._fetch(g)
                    except Exception:  # it is fetched again on demand at its unpack
                        self.failed = True
                        log.debug("vigil: swap prefetch failed", exc_info=True)

    def _fetch(self, g: _Group) -> None:
        torch = self.torch
        if self.streams is not None and g.device.type == "cuda":
            dev = self.streams.fetch(g)
        else:
            dev = torch.empty(g.nbytes, dtype=torch.uint8, device=g.device)
            dev.copy_(g.host)
        g.dev = dev
        if not g.resident:
            g.resident = True
            self._add(g)

    # -- memory account ------------------------------------------------------------------

    def _add(self, g: _Group) -> None:
        if g.counted:
            self.resident += g.nbytes
            if self.resident > self.peak:
                self.peak = self.resident

    def release(self, g: _Group) -> None:
        g.alive -= 1
        if g.alive > 0:
            return
        if g.resident and g.counted:
            self.resident -= g.nbytes
        g.resident = False
        g.host = g.dev = None


def _storage_weakref() -> Any:
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef


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
    """Applies swap policies, one step at a time (see the module docstring)."""

    def __init__(self) -> None:
        self._pending: tuple[_Policy | None] | None = None  # set_policy, not yet applied
        self._policy: _Policy | None = None
        self._state: _Step | None = None
        self._hooks: tuple[Any, Any] | None = None
        self._streams: _Streams | None = None
        self._lock = threading.Lock()
        self.counts = {"steps": 0, "applied": 0, "skipped": 0, "failed": 0, "rejected": 0}
        self.last: dict[str, Any] | None = None  # the report of the last step

    @property
    def version(self) -> int | None:
        """The version of the policy in force (None: none)."""
        return None if self._policy is None else self._policy.version

    def set_policy(self, policy: dict[str, Any] | None) -> bool:
        """Use ``policy`` from the next step on (None: stop swapping). A policy that cannot be
        read is refused (False, counted) and the one in force stays."""
        try:
            parsed = None if policy is None else _Policy(policy)
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
        if self._policy is None:
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
        self._state = _Step(self._policy, torch, self._streams)
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
        skipped = state.mismatch or (p is not None and len(state.groups) != len(p.sizes))
        self.counts["skipped" if skipped else "applied"] += 1
        if state.failed:
            self.counts["failed"] += 1
        report: dict[str, Any] = {
            "policy_version": None if policy is None else policy.version,
            "peak_bytes": (p.base if p is not None else 0) + state.peak,
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

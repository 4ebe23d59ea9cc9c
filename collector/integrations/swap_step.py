"""One step under a swap policy: the policy as the executor reads it, the saved storages,
their copies out and back, and the memory account (``collector.integrations.swap`` has the
rules and drives it; this module is its per-step state)."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from collector.integrations.swap_cuda import CudaCopies as _Streams

log = logging.getLogger("vigil.collector")


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

    def __init__(
        self,
        policy: _Policy | None,
        torch: Any,
        streams: _Streams | None,
        param_ptrs: frozenset[int] = frozenset(),
    ) -> None:
        self.policy = policy
        self.torch = torch
        self.streams = streams
        # Storages of parameters and buffers (their data pointers), known from a profile:
        # without a policy they are not counted (a buffer's slice saved for backward).
        self.param_ptrs = param_ptrs
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
            counted = not (base.is_leaf and base.requires_grad) and not self._param_storage(t)
        g = _Group(gid, nbytes, counted, t.device)
        self.groups.append(g)
        self._add(g)
        return g

    def _param_storage(self, t: Any) -> bool:
        if not self.param_ptrs:
            return False
        try:
            return int(t.untyped_storage().data_ptr()) in self.param_ptrs
        except Exception:
            return False

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

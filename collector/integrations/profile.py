"""Profile one step in detail: the input of the activation-swap policy (issue 14).

    from collector.integrations.profile import capture_profile

    def step():
        loss = model(batch).sum()
        loss.backward()
        opt.step()

    profile = capture_profile(step, module=model, optimizer=opt)

``capture_profile`` runs ``step_fn`` once under the op-sequence dispatch mode
(``collector.integrations.opseq``) and returns a JSON-able dict (format version 1):

- ``fingerprint`` (32 hex, the op sequence's fingerprint, as on step records),
  ``structure`` (16 hex over the op names only: same structure, other shapes), ``device``;
- ``ops``: every aten op in run order, ``{"i", "name", "phase", "module", "start_s",
  "duration_s"}``; ``phase`` is ``forward``, ``backward`` (run by the autograd engine) or
  ``other`` (grad mode off, as in the optimizer's update, and ``profiler::`` range marks
  from ``record_function``); ``module`` is the dotted path of the innermost ``nn.Module``
  running the op (forward ops; ``""`` for the others or outside any module); times in
  seconds from the step's start, measured around the op's dispatch (host time: on CUDA it
  is launch time unless ``cuda_sync=True``, which synchronises after every op);
- ``saved``: every tensor autograd saved for backward, in pack order: ``{"id", "storage",
  "bytes", "shape", "dtype", "producer", "consumer", "last_use", "param"}``. Tensors that
  are views of one storage (q, k, v cut from one projection) share a ``storage`` id (ids
  numbered in order of first pack) and carry the *storage's* bytes (count it once per
  group). ``producer`` is the forward op that saved it (an op's inputs are saved just before
  it runs, its outputs just after); ``consumer`` the first op run by the backward node that
  unpacked it, ``last_use`` the last op of the last node that unpacked it (it is freed after
  that); a tensor never unpacked has ``consumer`` -1 and lives to the step's last op.
  ``param`` marks parameters, buffers and their views: they live anyway and are never
  offloaded;
- ``param_bytes``, ``grad_bytes`` (parameters that require grad), ``optimizer_bytes`` (the
  optimizer's state tensors), ``step_s`` (wall time of the profiled step, profiling
  included) and ``saved_complete`` (False where the user's own saved-tensor hooks were
  active, so nothing was seen).

In the collector, every full op-sequence capture records this detail, and the profile is
shipped with the op sequence the first time its fingerprint is seen (``{"type": "opseq",
"hash", "ops", "profile"}``); steady-state steps pay only the shape fingerprint. About
200 bytes of JSON per op and per saved tensor: a 10,000-op step ships about 2 MB.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from time import perf_counter
from typing import Any

from collector.integrations.opseq import _Capture
from collector.integrations.shape_fp import RECORDER

log = logging.getLogger("vigil.collector")

VERSION = 1
MAX_SAVED = 50_000  # saved tensors recorded per step, as ``opseq.MAX_OPS`` ops
_optimizers: weakref.WeakSet[Any] = weakref.WeakSet()  # every optimizer that stepped
_hooked = False


def setup_once() -> None:
    """Remember optimizers as they step (a global pre-hook), for their state's bytes."""
    global _hooked
    if _hooked:
        return
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(_remember_optimizer)
    _hooked = True


def _remember_optimizer(optimizer: Any, args: Any, kwargs: Any) -> None:
    with contextlib.suppress(Exception):  # never into the user's optimizer.step()
        _optimizers.add(optimizer)


def capture_profile(
    step_fn: Callable[[], Any],
    *,
    module: Any = None,
    optimizer: Any = None,
    cuda_sync: bool = False,
) -> dict[str, Any]:
    """Run ``step_fn()`` (forward + backward, optionally the optimizer) once and profile it.

    Exceptions from ``step_fn`` propagate; a profiler that cannot run (inside
    ``torch.compile`` tracing or a fake/functional mode) raises ``RuntimeError``."""
    capture = ProfileCapture(module=module, cuda_sync=cuda_sync)
    if not capture.start():
        raise RuntimeError("the profiler cannot run here (compiling, or under a fake mode)")
    try:
        step_fn()
    finally:
        capture.stop()
    if not capture.ok:
        raise RuntimeError("the profiler failed during the step")
    fingerprint, _ = capture.result()
    return capture.profile(fingerprint, optimizers=[optimizer] if optimizer is not None else None)


class ProfileCapture(_Capture):
    """The op-sequence capture plus timings, module paths and saved tensors' life."""

    def __init__(self, *, module: Any = None, cuda_sync: bool = False) -> None:
        super().__init__()
        import torch

        self.current_node = torch._C._current_autograd_node
        self.grad_enabled = torch.is_grad_enabled
        self.sync = torch.cuda.synchronize if cuda_sync and torch.cuda.is_available() else None
        self.t0 = self.t_end = 0.0
        self.starts: list[float] = []
        self.durations: list[float] = []
        self.modules: list[str] = []
        self.phases: list[str] = []
        # per saved tensor: [storage, bytes, shape, dtype, producer, consumer, last_use, param]
        self.saved: list[list[Any]] = []
        self.pending: list[int] = []  # saved ids, aligned with the base class's ``saves``
        self.groups: dict[tuple[str, int], tuple[int, list[Any]]] = {}
        self.n_storages = 0
        self.param_ptrs: set[int] = set()
        self.devices: set[str] = set()
        self.awaiting: list[int] = []  # unpacked, waiting for the next backward op
        self.node: Any = None  # the autograd node that unpacked last …
        self.node_saved: list[int] = []  # … and what it unpacked
        self.stack: list[Any] = []
        self.paths: dict[int, str] = {}
        self.roots: list[Any] = []
        self.saw_saves = False  # our saved-tensor hooks were on (not the user's)
        self.unpack = self._unpack_profiled
        if module is not None:
            self._add_root(module)

    # -- entering and leaving ------------------------------------------------------------

    def start(self) -> bool:
        if not super().start():
            return False
        self.saw_saves = self.hooked
        self.t0 = perf_counter()
        if RECORDER.install() and RECORDER.owner is None:
            RECORDER.owner = self
        return True

    def stop(self) -> None:
        self.t_end = perf_counter()
        if RECORDER.owner is self:
            RECORDER.owner = None
        self.stack = []
        self.node, self.node_saved = None, []
        super().stop()

    # -- module paths --------------------------------------------------------------------

    def _add_root(self, root: Any) -> None:
        self.roots.append(root)
        for name, m in root.named_modules():
            self.paths.setdefault(id(m), name)
        for t in (*root.parameters(), *root.buffers()):
            with contextlib.suppress(Exception):
                self.param_ptrs.add(t.untyped_storage().data_ptr())

    def enter_module(self, module: Any) -> None:
        if not self.active or threading.get_ident() != self.thread:
            return
        if not self.stack and id(module) not in self.paths:
            self._add_root(module)
        self.stack.append(module)

    def leave_module(self, module: Any) -> None:
        stack = self.stack
        if not stack or threading.get_ident() != self.thread:
            return
        while stack:  # past an exception, modules above this one never left
            if stack.pop() is module:
                break

    def _module_path(self) -> str:
        if not self.stack:
            return ""
        m = self.stack[-1]
        path = self.paths.get(id(m))
        return path if path is not None else type(m).__qualname__

    # -- ops -----------------------------------------------------------------------------

    def record(self, func: Any, args: Any, out: Any, started: float = 0.0) -> None:
        if self.sync is not None:
            self.sync()
        ended = perf_counter()
        index = len(self.ops)
        super().record(func, args, out, started)
        if len(self.ops) == index:  # past MAX_OPS: kept by count only
            self.pending, self.awaiting = [], []
            return
        node = self.current_node()
        if node is not None:
            self.phases.append("backward")
            self.modules.append("")
            saved = self.saved
            for sid in self.awaiting:
                if saved[sid][5] is None:
                    saved[sid][5] = index
            self.awaiting = []
            if node is self.node:
                for sid in self.node_saved:
                    saved[sid][6] = index
        else:
            forward = self.grad_enabled() and not self.ops[index][0].startswith("profiler::")
            self.phases.append("forward" if forward else "other")
            self.modules.append(self._module_path())
        self.starts.append(started - self.t0)
        self.durations.append(ended - started)

    def _claimed(self, mine: list[bool]) -> None:
        index = len(self.ops)  # the op being recorded; index - 1 ran before the saves
        pending, self.pending = self.pending[: len(mine)], self.pending[len(mine) :]
        for sid, is_mine in zip(pending, mine, strict=False):
            if sid >= 0:
                self.saved[sid][4] = index if is_mine or index == 0 else index - 1

    def result(self) -> tuple[str, list[list[Any]]]:
        last = len(self.ops) - 1
        for sid in self.pending:  # saved after the last op: its outputs
            if sid >= 0:
                self.saved[sid][4] = max(last, 0)
        self.pending = []
        return super().result()

    # -- saved tensors -------------------------------------------------------------------

    def _pack(self, t: Any) -> Any:
        detached = super()._pack(t)
        if not self.active:
            return detached
        sid = -1
        try:
            if len(self.saved) < MAX_SAVED:
                sid = self._add_saved(t, detached)
        except Exception:
            log.debug("vigil: saved-tensor record failed", exc_info=True)
        while len(self.pending) < len(self.saves):
            self.pending.append(sid)
        return (sid, detached)

    def _add_saved(self, t: Any, detached: Any) -> int:
        base = t._base if t._base is not None else t
        param = bool(base.is_leaf and base.requires_grad)
        device = t.device.type
        self.devices.add(device)
        try:
            storage = t.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
        except Exception:  # no storage (sparse, nested, a wrapper subclass)
            ptr, nbytes = 0, t.numel() * t.element_size()
        if ptr and ptr in self.param_ptrs:
            param = True
        group = self.groups.get((device, ptr)) if ptr else None
        # A storage whose saved tensors all died was freed: its address may be reused.
        if group is not None and any(r() is not None for r in group[1]):
            storage_id = group[0]
            group[1].append(weakref.ref(detached))
        else:
            storage_id = self.n_storages
            self.n_storages += 1
            if ptr:
                self.groups[(device, ptr)] = (storage_id, [weakref.ref(detached)])
        dtype = str(t.dtype).removeprefix("torch.")
        self.saved.append([storage_id, nbytes, list(t.shape), dtype, None, None, None, param])
        return len(self.saved) - 1

    def _unpack_profiled(self, packed: Any) -> Any:
        if type(packed) is not tuple:  # packed after a failure switched us off
            return packed
        sid, t = packed
        if self.active and sid >= 0:
            try:
                self.awaiting.append(sid)
                node = self.current_node()
                if node is not self.node:
                    self.node, self.node_saved = node, []
                self.node_saved.append(sid)
            except Exception:
                pass
        return t

    # -- the profile ---------------------------------------------------------------------

    def profile(
        self, fingerprint: str, *, optimizers: Iterable[Any] | None = None
    ) -> dict[str, Any]:
        names = [op[0] for op in self.ops]
        structure = hashlib.blake2b("\n".join(names).encode(), digest_size=8)
        structure.update(b"#%d" % self.count)
        ops = [
            {
                "i": i,
                "name": names[i],
                "phase": self.phases[i],
                "module": self.modules[i],
                "start_s": round(self.starts[i], 7),
                "duration_s": round(self.durations[i], 7),
            }
            for i in range(len(names))
        ]
        last = len(names) - 1
        saved = []
        for i, (storage, nbytes, shape, dtype, producer, consumer, last_use, param) in enumerate(
            self.saved
        ):
            producer = last if producer is None else producer
            if consumer is None:  # never unpacked: held until the graph goes, at the end
                consumer, last_use = -1, last
            elif last_use is None or last_use < consumer:
                last_use = consumer
            saved.append(
                {
                    "id": i,
                    "storage": storage,
                    "bytes": nbytes,
                    "shape": shape,
                    "dtype": dtype,
                    "producer": max(producer, 0),
                    "consumer": consumer,
                    "last_use": max(last_use, 0),
                    "param": param,
                }
            )
        params = _unique(p for root in self.roots for p in root.parameters())
        if not params:  # no module seen: the optimizers' parameters
            params = _unique(
                p
                for opt in (optimizers or _optimizers)
                for group in opt.param_groups
                for p in group["params"]
            )
        for p in params:
            self.devices.add(p.device.type)
        states = [
            t
            for opt in (optimizers if optimizers is not None else list(_optimizers))
            for state in opt.state.values()
            for t in (state.values() if isinstance(state, dict) else ())
            if hasattr(t, "untyped_storage")
        ]
        profile = {
            "version": VERSION,
            "fingerprint": fingerprint,
            "structure": structure.hexdigest(),
            "device": "cuda" if "cuda" in self.devices else "cpu",
            "ops": ops,
            "saved": saved,
            "param_bytes": _nbytes(params),
            "grad_bytes": _nbytes([p for p in params if p.requires_grad]),
            "optimizer_bytes": _nbytes(_unique(states)),
            "step_s": round(self.t_end - self.t0, 7),
            "saved_complete": self.saw_saves,
        }
        self.roots = []
        return profile


def _unique(tensors: Iterable[Any]) -> list[Any]:
    """Each tensor once (a weight tied into two modules is one parameter)."""
    seen: set[int] = set()
    out = []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def _nbytes(tensors: Iterable[Any]) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors))


# The largest opseq event with its profile: half the server's default 8 MiB body limit, so
# it fits in a batch with the other events. A 10,000-op step is about 2.2 MB.
MAX_EVENT_BYTES = 4 << 20


def fits(event: dict[str, Any], profile: dict[str, Any]) -> bool:
    """Whether the event with ``profile`` encodes within ``MAX_EVENT_BYTES`` (measured only
    past a count where it might not: about 250 bytes per op and per saved tensor)."""
    if (len(event["ops"]) + len(profile["ops"]) + len(profile["saved"])) * 250 < MAX_EVENT_BYTES:
        return True
    with_profile = {**event, "profile": profile}
    return len(json.dumps(with_profile, separators=(",", ":"))) <= MAX_EVENT_BYTES

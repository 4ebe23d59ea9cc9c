"""Operator-sequence fingerprints: a cheap hash of the aten ops one sampled step runs.

Every step carries a cheap structural fingerprint, ``shape_fp`` (``shape_fp.py``: the
modules that ran and their tensor shapes, from one global module hook). The full capture
below runs on sampled steps and on the step after one whose ``shape_fp`` no capture has
covered yet (``OpSeqListener`` has the rule and its back-off), so a changed sequence is
captured at once rather than at the next sampled step. Each capture also profiles the step
(``profile.py``) and the profile ships with the sequence the first time it is seen.

On steps where ``step % opseq_every == 0`` a ``TorchDispatchMode`` records every aten op
the step dispatches, forward and backward (``aten::addmm``, ``aten::threshold_backward`` …):
its name, the shapes of its tensor inputs, and the bytes of tensors autograd saved for its
backward. At the end of the step the fingerprint (32 hex digits of blake2b over that list)
goes on the step record; the first time this client sees a fingerprint it ships the list:

    {"type": "opseq", "hash": "9f2c…", "ops": [["aten::mm", [[8, 256], [256, 256]], 8192], …]}

Saved bytes come from a ``saved_tensors_hooks`` pack hook that returns ``t.detach()`` (what
torch documents for an identity hook) and counts ``numel * element_size``. Autograd saves an
op's inputs just before the op runs and its outputs just after, so a save made between two
ops counts for the next op when the tensor is one of its inputs, else for the op before
(relu's output, say). Parameters (and views of them) are left out: they live anyway. Where
the user's own saved-tensor hooks are active (``save_on_cpu``, checkpointing) theirs take
precedence and those saves count 0. ``aten::detach`` is left out of the sequence: autograd
issues it for saved tensors, differently with and without hooks.

Cost: other steps pay only the shape fingerprint (no mode is active). A captured step pays
the Python dispatch of every op (about 19 µs/op for any ``TorchDispatchMode`` on a slow
2-core box), our recording and profiling (a few µs/op, a few µs per saved tensor), and
about 1 µs/op at its end for the fingerprint; so sample sparsely (``opseq_every``, default
100). ``VIGIL_OPSEQ_EVERY=0`` turns every full capture off, ``VIGIL_OPSEQ_SHAPES=0`` the
shape fingerprint.

Our mode is put at the bottom of the dispatch-mode stack, so modes the user enters and
leaves, even across a step boundary, still pop their own; it ignores compile internals, so
``torch.compile`` keeps compiling (ops inside compiled regions are not seen), and lets
higher-order ops (``torch.cond``) through. Step start and end must come on one thread, as
the client's do.
"""

from __future__ import annotations

import hashlib
import logging
import marshal
import threading
import weakref
from time import perf_counter as _clock
from typing import Any

from collector.client import Client, StepListener
from collector.integrations._stacks import _infra_mode_active, _insert_bottom, _remove
from collector.integrations._stacks import _remove_saved_hooks as _remove_saved_hooks
from collector.integrations.shape_fp import RECORDER

log = logging.getLogger("vigil.collector")

# Ops kept per sequence (the hash still covers the count of all). ~50 bytes of JSON an op,
# so a full sequence stays well inside the server's 8 MiB body limit.
MAX_OPS = 50_000
_clients: weakref.WeakSet[Client] = weakref.WeakSet()
_disabled = False  # set when the mode stack could not be managed safely


def setup_once(client: Client) -> None:
    """Attach the op-sequence listener to this client (once per client; re-init works)."""
    if client in _clients:
        return
    import torch  # noqa: F401  (fail here, not on the first sampled step)

    from collector.integrations import profile

    profile.setup_once()
    client.add_step_listener(OpSeqListener(client))
    _clients.add(client)


# Shape fingerprints remembered as captured (past it, new ones are still captured, rate
# limited as for a job whose shapes change every step).
MAX_SHAPES = 4096
MAX_DELAY = 8


class OpSeqListener(StepListener):
    """Full capture on sampled steps (``step % opseq_every == 0``) and soon after a step
    runs a shape fingerprint no capture has covered yet.

    A capture is armed for the step after that one (``delay`` 1). When the captured step
    shows another shape (a one-off, or buckets that alternate) it is a miss: the next arming
    waits one step more, so a pattern of period p is hit once the delay reaches p. Arming
    that comes close after the last triggered capture backs off (``gap`` doubles, up to the
    sampling period), so shapes that change every step cost about what sampling costs."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.capture: _Capture | None = None
        self.seen: set[str] = set()
        self.shapes = client.config.opseq_shapes
        self.captured: set[str] = set()  # shape fingerprints a full capture has covered
        self.armed_at: int | None = None  # capture the first step from here on …
        self.wanted: str | None = None  # … hoping it runs this shape again
        self.delay = 1
        self.gap = 1
        self.last_trigger = -(1 << 62)

    def on_step_start(self, step: int) -> None:
        if self.capture is not None:  # the previous step closed without on_step_end
            self._finish(record=False)
        if self.shapes:
            RECORDER.start()
        every = self.client.config.opseq_every
        if _disabled or every <= 0:
            return
        armed = self.armed_at is not None and step >= self.armed_at
        if step % every and not armed:
            return
        if armed:
            since = step - self.last_trigger
            self.gap = min(self.gap * 2, every) if since < every else 1
            self.last_trigger = step
            self.armed_at = None
        from collector.integrations.profile import ProfileCapture

        capture = ProfileCapture()
        if capture.start():
            self.capture = capture

    def on_step_end(self, step: int) -> None:
        shape = RECORDER.stop() if self.shapes else None
        if shape is not None:
            self.client.set_step_fields(shape_fp=shape)
        if self.capture is not None:
            self._finish(record=True, shape=shape)
        if self.wanted is not None and self.wanted in self.captured:  # a sampled step did
            self.armed_at = self.wanted = None
        if shape is not None and shape not in self.captured and self.armed_at is None:
            self.wanted = shape
            self.armed_at = max(step + self.delay, self.last_trigger + self.gap)

    def _finish(self, *, record: bool, shape: str | None = None) -> None:
        capture, self.capture = self.capture, None
        if capture is None:
            return
        capture.stop()
        if shape is not None and self.wanted is not None and self.armed_at is None:
            hit = shape == self.wanted
            self.delay = 1 if hit else min(self.delay + 1, MAX_DELAY)
            self.wanted = None
        if not capture.ok:
            return
        fingerprint, ops = capture.result()
        if record:
            self.client.set_opseq(fingerprint)
        if shape is not None and len(self.captured) < MAX_SHAPES:
            self.captured.add(shape)
        if fingerprint not in self.seen:
            self.seen.add(fingerprint)
            event: dict[str, Any] = {"type": "opseq", "hash": fingerprint, "ops": ops}
            try:
                from collector.integrations.profile import fits

                profile = capture.profile(fingerprint)  # type: ignore[attr-defined]
                if fits(event, profile):
                    event["profile"] = profile
                else:
                    self.client.worker.drop("profile_too_large")
                    log.warning("vigil: a profile of %d ops is too large to ship", len(ops))
            except Exception:
                log.warning("vigil: op-sequence profile failed; shipped without it", exc_info=True)
            self.client.submit(event)


class _Capture:
    """One sampled step: the dispatch mode, the saved-tensor hooks, and the ops seen."""

    def __init__(self) -> None:
        import torch

        self.tensor_type = torch.Tensor
        self.no_dispatch = torch._C._DisableTorchDispatch
        self.ops: list[list[Any]] = []
        self.count = 0  # ops dispatched, including those past MAX_OPS
        self.last: list[Any] | None = None  # the op recorded last …
        self.last_out: tuple[int, ...] = ()  # … and its outputs (``Tensor._cdata``)
        self.saves: list[tuple[int, int]] = []  # (tensor, bytes) saved since that op
        self.active = False
        self.ok = True
        self.names: dict[Any, str] = {}
        self.mode: Any = None
        self.hooked = False
        self.thread = 0
        self.pack = self._pack  # the exact objects pushed, to find them on the stack
        self.unpack = _unpack

    # -- entering and leaving ------------------------------------------------------------

    def start(self) -> bool:
        import torch

        try:
            if torch.compiler.is_compiling() or _infra_mode_active():
                return False
            self.mode = _make_mode(self)
            _insert_bottom(self.mode)
        except Exception:
            log.debug("vigil: op-sequence capture could not start", exc_info=True)
            return False
        self.active = True
        self.thread = threading.get_ident()
        try:  # only where no saved-tensor hooks are active: never override the user's
            autograd = torch._C._autograd
            if autograd._top_saved_tensors_default_hooks(True) is None:
                autograd._push_saved_tensors_default_hooks(self.pack, self.unpack)
                self.hooked = True
        except Exception:  # e.g. inside disable_saved_tensors_hooks()
            log.debug("vigil: saved-tensor hooks unavailable this step", exc_info=True)
        return True

    def stop(self) -> None:
        global _disabled
        self.active = False
        if threading.get_ident() != self.thread:  # the stacks are the other thread's
            _disabled, self.ok = True, False
            log.warning("vigil: a step ended on another thread; op-sequence capture is off")
            return
        if self.hooked:
            self.hooked = False
            try:
                _remove_saved_hooks(self.pack)
            except Exception:
                log.debug("vigil: could not remove saved-tensor hooks", exc_info=True)
        if self.mode is not None:
            mode, self.mode = self.mode, None
            try:
                _remove(mode)
            except Exception:
                _disabled = True
                self.ok = False
                log.warning("vigil: op-sequence capture disabled", exc_info=True)

    def result(self) -> tuple[str, list[list[Any]]]:
        if self.last is not None:
            self.last[2] += sum(n for _, n in self.saves)
        self.saves = []
        ops = self.ops
        # marshal version 2 writes no back-references: the bytes depend on the values only.
        digest = hashlib.blake2b(marshal.dumps(ops, 2), digest_size=16)
        digest.update(b"#%d" % self.count)
        return digest.hexdigest(), ops

    # -- per op ----------------------------------------------------------------------------

    def record(self, func: Any, args: Any, out: Any, started: float = 0.0) -> None:
        """One op, after it ran (``started``: ``perf_counter()`` before; the profiler
        uses it)."""
        self.count += 1
        if len(self.ops) >= MAX_OPS:
            self.last, self.saves = None, []
            return
        name = self.names.get(func)
        if name is None:
            name = self.names[func] = _op_name(func)
        tensor = self.tensor_type
        shapes = []
        inputs = []
        for a in args:
            if isinstance(a, tensor):
                shapes.append(list(a.shape))
                inputs.append(a._cdata)
            elif isinstance(a, (list, tuple)):
                for t in a:
                    if isinstance(t, tensor):
                        shapes.append(list(t.shape))
                        inputs.append(t._cdata)
        op = [name, shapes, self._claim(inputs) if self.saves else 0]
        self.ops.append(op)
        self.last = op
        if isinstance(out, tensor):
            self.last_out = (out._cdata,)
        elif isinstance(out, (list, tuple)):
            self.last_out = tuple(t._cdata for t in out if isinstance(t, tensor))
        else:
            self.last_out = ()

    def _claim(self, inputs: list[int]) -> int:
        """Split the saves made since the last op between it (its outputs, saved after it
        ran) and this one (its inputs, saved before it runs); return this op's bytes.

        A tensor that is both (the last op's output feeding this op) counts for this op,
        unless it was saved twice: then the first save was the last op's own."""
        saves, self.saves = self.saves, []
        mine_flags = []
        mine = theirs = 0
        twice: set[int] = set()
        for i, (t, n) in enumerate(saves):
            if t not in inputs:
                is_mine = False
            elif t in self.last_out and t not in twice and any(s == t for s, _ in saves[i + 1 :]):
                twice.add(t)
                is_mine = False
            else:
                is_mine = True
            mine_flags.append(is_mine)
            if is_mine:
                mine += n
            else:
                theirs += n
        if theirs and self.last is not None:
            self.last[2] += theirs
        self._claimed(mine_flags)
        return mine

    def _claimed(self, mine: list[bool]) -> None:
        """Which of the saves just claimed went to the op being recorded (True) and which
        to the one before it; the profiler's hook (``ops`` does not yet hold this op)."""

    def _pack(self, t: Any) -> Any:
        try:
            if self.active:
                # Parameters (and views of them) count 0 bytes: they live anyway.
                base = t._base if t._base is not None else t
                param = base.is_leaf and base.requires_grad
                self.saves.append((t._cdata, 0 if param else t.numel() * t.element_size()))
        except Exception:
            pass
        # Not ``t`` itself: a saved output would hold its own grad_fn. A plain tensor is
        # detached without a round trip through our mode; subclasses keep their dispatch.
        if type(t) is self.tensor_type:
            with self.no_dispatch():
                return t.detach()
        return t.detach()


def _unpack(packed: Any) -> Any:
    return packed


def _op_name(func: Any) -> str:
    schema = getattr(func, "_schema", None)
    if schema is not None:
        return str(schema.name)  # "aten::addmm", as the profiler names it
    return f"hop::{getattr(func, '_name', func)}"  # a higher-order op (cond, flex_attention…)


def _make_mode(capture: _Capture) -> Any:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    global _Mode, _detach
    if _Mode is None:
        _detach = torch.ops.aten.detach.default

        class OpSeqMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
            # Higher-order ops pass through __torch_dispatch__ (the default is to refuse
            # them, which would break a step that calls torch.cond or flex_attention).
            supports_higher_order_operators = True

            @classmethod
            def ignore_compile_internals(cls) -> bool:
                # Off while torch.compile or a higher-order op traces (torch.cond's backward
                # fails under a mode that is not), on again when the compiled code runs.
                return True

            def __init__(self, capture: _Capture) -> None:
                super().__init__()  # type: ignore[no-untyped-call]
                self.capture = capture

            def __torch_dispatch__(
                self, func: Any, types: Any, args: Any = (), kwargs: Any = None
            ) -> Any:
                cap = self.capture
                started = _clock()
                out = func(*args, **(kwargs or {}))
                # aten::detach is left out: autograd issues it for saved outputs without
                # our hooks and for saved tensors on unpack with them.
                if cap.active and func is not _detach:
                    try:
                        cap.record(func, args, out, started)
                    except Exception:
                        cap.active = cap.ok = False
                        log.debug("vigil: op-sequence record failed", exc_info=True)
                return out

        _Mode = OpSeqMode
    return _Mode(capture)


_Mode: Any = None
_detach: Any = None

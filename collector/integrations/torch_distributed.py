"""Collective timing for ``torch.distributed``: every call is in flight from entry to completion.

``setup_once()`` wraps the collective and point-to-point functions of ``torch.distributed``
(``all_reduce`` … ``batch_isend_irecv``, and the object collectives) where they are bound:
``torch.distributed``, ``distributed_c10d`` and any loaded ``torch.distributed`` module that
imported one by name, so ``dist.all_reduce`` and torch's internal callers agree. Also
``dist._broadcast_coalesced``, with which DDP syncs parameters at construction and buffers
before every forward (recorded as ``broadcast``). Each call becomes a ``Collective`` of the
live client: group label, member ranks, op, bytes of its input tensors.

- Blocking calls begin before and end after the call, on the calling thread (so the chaos
  ``slow_collective`` delay really delays the caller). While a rank is blocked its heartbeat
  reports the call as in flight.
- ``async_op=True`` calls return torch's own ``Work`` (no proxy); the record ends when
  ``work.get_future()`` completes. Work without futures (gloo ``isend``/``irecv``) ends when
  ``Work.wait()`` returns, or when the ``Work`` is garbage collected without a wait; until a
  thread waits on it the call is *parked* and the heartbeat leaves it out (a rank computing
  while its send waits for the receiver is not blocked in that send).
- Point-to-point calls (``send``/``recv``, ``isend``/``irecv``, ``batch_isend_irecv``, the
  object variants) carry their peers as global ranks (``group_dst``/``group_src`` resolved
  through the group); a batch's op leaves them when its work completes. The heartbeat's
  in-flight op reports them (``peers``), so the server follows a pipeline's waits from rank
  to rank. They do not advance the group's collective ``seq`` (they carry the number of
  collectives before them, as Flight Recorder does).
- A call made inside another recorded one on the same thread (``send`` → ``isend``,
  ``broadcast_object_list`` → ``broadcast``) is not recorded twice; object collectives add
  the bytes of the tensor collectives they issue.
- DDP's gradient all-reduces run in C++; at a DDP module's first forward a communication
  hook that times each bucket is registered (torch's ``allreduce_hook``, which gives the same
  result as the built-in one). A hook the user registers replaces it and is timed the same way.
  A DDP module built *before* ``vigil.init()`` gets the same hook at its first forward after
  it (``DDP.forward`` is wrapped at class level). Where that cannot be done — a hook was
  registered before init, or a built-in C++ hook (e.g. ``FP16_COMPRESS`` via
  ``_register_builtin_comm_hook``) — the gradient all-reduces are not timed, the straggler
  detector cannot see which rank waits least, and the collector says so once: a warning in
  the log and a ``collectives_untimed`` event (``attrs``: ``rank``, ``what``, ``reason``)
  that the job page shows as "collectives not timed on ranks …".

Group labels: ``"world"`` for the default group (members left out: everyone), otherwise the
c10d group name, prefixed by the group's description when one was given (``"mesh_dp/2"``).
Both are identical on every rank of a group and distinct between groups.

Not seen: collectives traced by ``torch.compile`` (functional collectives), ops issued inside
``_coalescing_manager`` (passed through untimed), built-in DDP hooks registered before the
first forward, and ``ProcessGroup`` methods called directly. On NCCL, futures complete when
the work is enqueued, so durations are host-side.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import collector
from collector.client import Client, Collective

log = logging.getLogger("vigil.collector")
_installed = False
_lock = threading.Lock()

# (name, payload parameter) for every wrapped function; the payload's bytes are the call's.
# ``None``: no payload (barriers) or bytes come from the nested tensor collectives (objects).
_FUNCTIONS: tuple[tuple[str, str | None], ...] = (
    ("all_reduce", "tensor"),
    ("all_reduce_coalesced", "tensors"),
    ("all_gather", "tensor"),
    ("all_gather_single", "input_tensor"),
    ("all_gather_into_tensor", "input_tensor"),
    ("_all_gather_base", "input_tensor"),
    ("all_gather_coalesced", "input_tensor_list"),
    ("reduce_scatter", "input_list"),
    ("reduce_scatter_single", "input"),
    ("reduce_scatter_tensor", "input"),
    ("_reduce_scatter_base", "input"),
    ("broadcast", "tensor"),
    ("reduce", "tensor"),
    ("gather", "tensor"),
    ("scatter", "tensor"),
    ("all_to_all", "input_tensor_list"),
    ("all_to_all_single", "input"),
    ("barrier", None),
    ("monitored_barrier", None),
    ("send", "tensor"),
    ("recv", "tensor"),
    ("isend", "tensor"),
    ("irecv", "tensor"),
    ("batch_isend_irecv", "p2p_op_list"),
    ("all_gather_object", None),
    ("broadcast_object_list", None),
    ("gather_object", None),
    ("scatter_object_list", None),
    ("send_object_list", None),
    ("recv_object_list", None),
)
_OBJECT_OPS = frozenset(n for n, _ in _FUNCTIONS if "object" in n)
# Point-to-point functions: (global peer parameter, group-local peer parameter).
_PEER_PARAMS = {
    "send": ("dst", "group_dst"),
    "isend": ("dst", "group_dst"),
    "send_object_list": ("dst", "group_dst"),
    "recv": ("src", "group_src"),
    "irecv": ("src", "group_src"),
    "recv_object_list": ("src", "group_src"),
}
_ALWAYS_ASYNC = frozenset({"isend", "irecv", "batch_isend_irecv"})
_OP_NAMES = {
    "_all_gather_base": "all_gather_into_tensor",
    "_reduce_scatter_base": "reduce_scatter_tensor",
}

# Filled by setup_once (torch.distributed is imported only when it is available).
_c10d: Any = None
_dist: Any = None
_tensor: Any = ()  # torch.Tensor once set up
_originals: dict[str, Callable[..., Any]] = {}
_wrappers: dict[str, Callable[..., Any]] = {}
_compiling: Callable[[], bool] = lambda: False  # noqa: E731


class _ThreadState(threading.local):
    outer: Collective | None = None  # the recorded call this thread is inside
    objects: bool = False  # whether ``outer`` takes the bytes of nested calls


_state = _ThreadState()


@dataclass(frozen=True, slots=True)
class _Spec:
    op: str
    group_at: int | None
    payload: str | None
    payload_at: int | None
    async_at: int | None
    always_async: bool
    objects: bool
    group_param: str = "group"
    # Point-to-point: where the peer is passed, as a global and as a group rank.
    peer_at: int | None = None
    peer_param: str | None = None
    group_peer_at: int | None = None
    group_peer_param: str | None = None


def setup_once(client: Client) -> None:
    global _installed, _c10d, _dist, _compiling, _tensor
    with _lock:
        if _installed:
            return
        import torch
        import torch.distributed as dist

        if not dist.is_available():
            return
        import torch.distributed.distributed_c10d as c10d

        _c10d, _dist, _tensor = c10d, dist, torch.Tensor
        _compiling = torch.compiler.is_compiling
        _installed = True  # never wrap twice, even if a step below fails
        _patch_functions(dist, c10d)
        for patch in (_patch_p2pop, _patch_ddp):
            try:
                patch(c10d)
            except Exception:
                log.warning(
                    "vigil: %s failed; continuing without it", patch.__name__, exc_info=True
                )


# -- wrapping the functions ------------------------------------------------------------


def _patch_functions(dist: Any, c10d: Any) -> None:
    import inspect

    for name, payload in _FUNCTIONS:
        original = getattr(c10d, name, None)
        if original is None or not callable(original):
            continue
        params = list(inspect.signature(original).parameters)
        peer, group_peer = _PEER_PARAMS.get(name, (None, None))
        spec = _Spec(
            op=_OP_NAMES.get(name, name),
            group_at=params.index("group") if "group" in params else None,
            payload=payload,
            payload_at=params.index(payload) if payload in params else None,
            async_at=params.index("async_op") if "async_op" in params else None,
            always_async=name in _ALWAYS_ASYNC,
            objects=name in _OBJECT_OPS,
            peer_at=params.index(peer) if peer in params else None,
            peer_param=peer,
            group_peer_at=params.index(group_peer) if group_peer in params else None,
            group_peer_param=group_peer,
        )
        wrapper = _wrap(original, spec)
        _originals[name], _wrappers[name] = original, wrapper
    # DDP broadcasts parameters at construction and buffers before every forward with this
    # C++ function (``dist._broadcast_coalesced(process_group, tensors, …)``): a rank whose
    # peer hangs before its forward waits here.
    coalesced = getattr(dist, "_broadcast_coalesced", None)
    if callable(coalesced):
        spec = _Spec("broadcast", 0, "tensors", 1, None, False, False, group_param="process_group")
        _originals["_broadcast_coalesced"] = coalesced
        _wrappers["_broadcast_coalesced"] = _wrap(coalesced, spec)
    # Rebind every module that holds an original under its own name (c10d, torch.distributed,
    # and e.g. torch.distributed.tensor._collective_utils when it was imported first).
    modules = [
        m
        for key, m in list(sys.modules.items())
        if m is not None and (key == "torch.distributed" or key.startswith("torch.distributed."))
    ]
    for module in modules:
        for name, original in _originals.items():
            if getattr(module, name, None) is original:
                setattr(module, name, _wrappers[name])
    # torch.compile maps these functions to traceable functional collectives by identity.
    try:
        from torch.distributed._functional_collectives import traceable_collective_remaps

        for name, original in _originals.items():
            if original in traceable_collective_remaps:
                traceable_collective_remaps[_wrappers[name]] = traceable_collective_remaps[original]
    except Exception:
        log.debug("vigil: could not register wrappers with torch.compile", exc_info=True)


def _wrap(original: Callable[..., Any], spec: _Spec) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        client = collector.get_client()
        if client is None:
            return original(*args, **kwargs)
        outer = _state.outer
        if outer is not None:  # issued by a call we are already timing
            if _state.objects:
                outer.nbytes += _payload_bytes(spec, args, kwargs)
            return original(*args, **kwargs)
        call = _begin(client, spec, args, kwargs)
        if call is None:
            return original(*args, **kwargs)
        _state.outer, _state.objects = call, spec.objects
        try:
            result = original(*args, **kwargs)
        except BaseException:
            _state.outer = None
            _end(client, call)
            raise
        _state.outer = None
        if spec.always_async or (
            spec.async_at is not None and _arg(args, kwargs, spec.async_at, "async_op", False)
        ):
            _track(client, call, result)
        else:
            _end(client, call)
        return result

    return wrapper


def _begin(client: Client, spec: _Spec, args: Any, kwargs: Any) -> Collective | None:
    """The call's record, or None when it is not to be timed (never raises)."""
    try:
        if _compiling() or _coalescing():
            return None
        peers: tuple[int, ...] | None = None
        if spec.op == "batch_isend_irecv":
            ops = _arg(args, kwargs, 0, "p2p_op_list", None) or []
            group = ops[0].group if ops else None
            nbytes = sum(_tensor_bytes(getattr(p, "tensor", None)) for p in ops)
            peers = tuple(int(p.peer) for p in ops if getattr(p, "peer", None) is not None)
        else:
            group = None
            if spec.group_at is not None:
                group = _arg(args, kwargs, spec.group_at, spec.group_param, None)
            nbytes = _payload_bytes(spec, args, kwargs)
            if spec.peer_param is not None:
                peers = _peer(spec, args, kwargs, group)
        info = _group_info(group)
        if info is None:  # this rank is not in the group: torch makes it a no-op
            return None
        return client.collective_begin(info[0], spec.op, nbytes, info[1], peers)
    except Exception:
        log.debug("vigil: collective begin failed", exc_info=True)
        return None


def _peer(spec: _Spec, args: Any, kwargs: Any, group: Any) -> tuple[int, ...]:
    """The global rank a send goes to or a receive comes from; ``()`` for a receive from
    any source (``src=None``) or a peer that cannot be resolved."""
    peer = _arg(args, kwargs, spec.peer_at, spec.peer_param or "", None)
    if peer is not None:
        return (int(peer),)
    local = _arg(args, kwargs, spec.group_peer_at, spec.group_peer_param or "", None)
    if local is None:
        return ()
    if group is None or group is _c10d.GroupMember.WORLD:
        return (int(local),)
    try:
        return (int(_c10d.get_global_rank(group, int(local))),)
    except Exception:
        return ()


def _coalescing() -> bool:
    """Inside ``_coalescing_manager`` calls are only queued; the coalesced call that runs
    them is made in C++ and is not seen."""
    world = getattr(_c10d, "_world", None)
    return bool(getattr(world, "pg_coalesce_state", None))


def _end(client: Client, call: Collective) -> None:
    try:
        client.collective_end(call)
    except Exception:
        log.debug("vigil: collective end failed", exc_info=True)


def _arg(args: Any, kwargs: Any, at: int | None, name: str, default: Any) -> Any:
    if at is not None and at < len(args):
        return args[at]
    return kwargs.get(name, default)


def _payload_bytes(spec: _Spec, args: Any, kwargs: Any) -> int:
    if spec.payload is None:
        return 0
    try:
        return _tensor_bytes(_arg(args, kwargs, spec.payload_at, spec.payload, None))
    except Exception:
        return 0


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, _tensor):
        return int(value.numel() * value.element_size())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    numel = getattr(value, "numel", None)
    if numel is None or not hasattr(value, "element_size"):
        return 0
    return int(numel()) * int(value.element_size())


# -- groups ----------------------------------------------------------------------------

_WORLD: tuple[str, list[int] | None] = ("world", None)
_groups: weakref.WeakKeyDictionary[Any, tuple[str, list[int] | None]] = weakref.WeakKeyDictionary()


def _group_info(group: Any) -> tuple[str, list[int] | None] | None:
    """(label, member ranks) of a process group, cached per group object; None when this
    rank is not a member."""
    if group is None:
        return _WORLD
    try:
        info = _groups.get(group)
    except TypeError:  # not weak-referenceable: resolve every time
        return _resolve_group(group)
    if info is None:
        resolved = _resolve_group(group)
        if resolved is None:
            return None
        _groups[group] = info = resolved
    return info


def _resolve_group(group: Any) -> tuple[str, list[int] | None] | None:
    c10d = _c10d
    if group is c10d.GroupMember.NON_GROUP_MEMBER or isinstance(group, int):
        return None
    if group is c10d.GroupMember.WORLD:
        return _WORLD
    name = str(getattr(group, "group_name", "") or "")
    desc = str(getattr(group, "group_desc", "") or "")
    label = f"{desc}/{name}" if desc and desc not in ("undefined", "default_pg") else name
    try:
        members: list[int] | None = [int(r) for r in c10d.get_process_group_ranks(group)]
    except Exception:
        members = None
    return (label or "unknown")[:128], members


# -- async completion ------------------------------------------------------------------


class _Pending:
    """One recorded call waiting for its pieces of work to complete. When the call is a
    batch of point-to-point ops, one work per op, a completed op's peer leaves the call's
    ``peers``: the rank no longer waits for it."""

    __slots__ = ("call", "client", "left", "lock", "peers")

    def __init__(self, client: Client, call: Collective, left: int) -> None:
        self.client, self.call, self.left = client, call, left
        self.lock = threading.Lock()
        peers = call.peers
        self.peers: list[int | None] | None = (
            list(peers) if peers is not None and len(peers) == left else None
        )

    def done(self, index: int, _fut: Any = None) -> None:
        with self.lock:
            self.left -= 1
            last = self.left == 0
            if self.peers is not None and not last:
                self.peers[index] = None
                self.call.peers = tuple(p for p in self.peers if p is not None)
        if last:
            _end(self.client, self.call)


_no_future: set[tuple[str, str]] = set()  # (group, op) whose Work has no future (gloo p2p)


def _track(client: Client, call: Collective, result: Any) -> None:
    try:
        works = [w for w in (result if isinstance(result, list) else [result]) if w is not None]
        if not works:
            _end(client, call)
            return
        pending = _Pending(client, call, len(works))
        key = (call.group, call.op)
        for index, work in enumerate(works):
            future = None
            if key not in _no_future:
                try:
                    future = work.get_future()
                except RuntimeError:  # "Work::getFuture not implemented"
                    _no_future.add(key)
            if future is not None:
                future.add_done_callback(functools.partial(pending.done, index))
            else:
                _end_on_wait(work, pending, index)
    except Exception:
        log.debug("vigil: could not track async work", exc_info=True)
        _end(client, call)


# Work without a future: ended by the patched ``Work.wait`` (or when the Work is collected).
# Until a thread waits on it, its call is *parked*: the rank is not blocked in it (it may be
# computing while a send waits for its receiver), so its heartbeat reports something else.
_waiting: dict[int, tuple[_Pending, int, weakref.finalize[Any, Any]]] = {}
_wait_patched = False


def _end_on_wait(work: Any, pending: _Pending, index: int) -> None:
    _patch_work_wait()
    key = id(work)
    finalizer = weakref.finalize(work, _settle, key)
    finalizer.atexit = False
    pending.call.parked = True
    _waiting[key] = (pending, index, finalizer)


def _settle(key: int) -> None:
    entry = _waiting.pop(key, None)
    if entry is not None:
        entry[2].detach()
        entry[0].done(entry[1])


def _patch_work_wait() -> None:
    global _wait_patched
    with _lock:
        if _wait_patched:
            return
        _wait_patched = True
    base = _c10d.Work
    original = base.wait

    @functools.wraps(original)
    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        entry = _waiting.get(id(self)) if _waiting else None
        if entry is None:
            return original(self, *args, **kwargs)
        call = entry[0].call
        call.parked = False  # blocked in it now: the heartbeat reports it
        try:
            completed = original(self, *args, **kwargs)
        except BaseException:
            _settle(id(self))
            raise
        if completed is not False:
            _settle(id(self))
        call.parked = True  # what is left of it waits for the next wait
        return completed

    base.wait = wait


# -- P2POp built with a function captured before setup ---------------------------------


def _patch_p2pop(c10d: Any) -> None:
    """``P2POp(isend, …)`` checks ``op in [isend, irecv]`` by identity; a script that bound
    ``isend`` before ``vigil.init()`` holds the unwrapped one. Map it to the wrapper."""
    p2pop = getattr(c10d, "P2POp", None)
    if p2pop is None or "isend" not in _wrappers:
        return
    swap = {_originals[n]: _wrappers[n] for n in ("isend", "irecv") if n in _originals}
    new, init = p2pop.__new__, p2pop.__init__

    @functools.wraps(new)
    def __new__(cls: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        return new(cls, swap.get(op, op), *args, **kwargs)

    @functools.wraps(init)
    def __init__(self: Any, op: Any, *args: Any, **kwargs: Any) -> None:
        init(self, swap.get(op, op), *args, **kwargs)

    p2pop.__new__ = __new__
    p2pop.__init__ = __init__


# -- DistributedDataParallel -----------------------------------------------------------


class _HookSlot:
    """State of the hook we register with DDP's reducer: the hook it runs (torch's
    ``allreduce_hook`` until the user registers theirs) and the group it reports under."""

    __slots__ = ("hook", "label", "members", "state", "user")

    def __init__(self, label: str, members: list[int] | None, hook: Any, state: Any) -> None:
        self.label, self.members, self.hook, self.state = label, members, hook, state
        self.user = False


@dataclass
class _DdpState:
    user: bool = False  # a hook of the user's (or torch's, e.g. mixed precision) is in place
    slot: _HookSlot | None = None  # ours, once registered
    arm: Any = None  # handle of the first-forward pre-hook


_ddp: weakref.WeakKeyDictionary[Any, _DdpState] = weakref.WeakKeyDictionary()


def _ddp_state(module: Any) -> _DdpState:
    st = _ddp.get(module)
    if st is None:
        _ddp[module] = st = _DdpState()
    return st


def _ddp_group(module: Any) -> tuple[str, list[int] | None]:
    try:
        return _group_info(getattr(module, "process_group", None)) or _WORLD
    except Exception:
        return _WORLD


def _patch_ddp(c10d: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    init, register = DDP.__init__, DDP.register_comm_hook
    builtin: Any = DDP._register_builtin_comm_hook
    forward: Any = DDP.forward

    @functools.wraps(forward)
    def forward_(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self not in _ddp:  # built before vigil.init(): adopt it now, once
            _adopt(self)
        return forward(self, *args, **kwargs)

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        try:
            st = _ddp_state(self)
            if not st.user and not getattr(self, "_use_python_reducer", False):
                st.arm = self.register_forward_pre_hook(_first_forward)
        except Exception:
            log.debug("vigil: could not arm the DDP hook", exc_info=True)

    @functools.wraps(register)
    def register_comm_hook(self: Any, state: object, hook: Callable[..., Any]) -> None:
        st = _ddp.get(self)
        slot = st.slot if st is not None else None
        if slot is not None and not slot.user:
            # Ours is registered and DDP takes one hook: theirs runs inside ours.
            self._check_comm_hook(hook)
            try:
                self.logger._set_comm_hook_name(hook.__qualname__)
                self._comm_hooks.append((hook, state))
            except Exception:
                log.debug("vigil: DDP hook bookkeeping failed", exc_info=True)
            slot.hook, slot.state, slot.user = hook, state, True
            return
        try:
            _ddp_state(self).user = True
            timed = _timed_user_hook(self, hook)
        except Exception:
            log.debug("vigil: could not wrap the DDP hook", exc_info=True)
            timed = hook
        register(self, state, timed)

    @functools.wraps(builtin)
    def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
        st = _ddp.get(self)
        slot = st.slot if st is not None else None
        python_hook = _python_builtin(comm_hook_type) if slot is not None else None
        if slot is not None and not slot.user and python_hook is not None:
            try:
                self.logger._set_comm_hook_name(str(comm_hook_type))
            except Exception:
                log.debug("vigil: DDP hook bookkeeping failed", exc_info=True)
            slot.hook, slot.state, slot.user = python_hook, self.process_group, True
            return
        _ddp_state(self).user = True  # a C++ hook: not timed
        builtin(self, comm_hook_type)
        _untimed(f"a built-in C++ communication hook ({comm_hook_type}) runs the all-reduces")

    DDP.__init__ = __init__  # type: ignore[method-assign]
    DDP.register_comm_hook = register_comm_hook  # type: ignore[method-assign]
    DDP._register_builtin_comm_hook = _register_builtin_comm_hook  # type: ignore[method-assign]
    DDP.forward = forward_  # type: ignore[method-assign]


def _adopt(module: Any) -> None:
    """A DDP module built before ``vigil.init()``: register the bucket hook now, or say
    that its gradient all-reduces cannot be timed. Never raises."""
    try:
        st = _ddp_state(module)
        if collector.get_client() is None or _compiling():
            return
        if getattr(module, "_use_python_reducer", False):
            return
        if getattr(module, "_divide_by_initial_world_size", True) is False or _sparse(module):
            return
        if getattr(module, "_comm_hooks", None):
            _untimed("a communication hook was registered before vigil.init()")
            return
        try:
            _install(module, st)
        except RuntimeError:
            _untimed("a built-in C++ communication hook was registered before vigil.init()")
    except Exception:
        log.debug("vigil: could not adopt a DDP module built before init", exc_info=True)


_warned_untimed = False


def _untimed(reason: str) -> None:
    """Say once per process, loudly, that DDP's gradient all-reduces are not timed."""
    global _warned_untimed
    client = collector.get_client()
    if _warned_untimed or client is None:
        return
    _warned_untimed = True
    rank = client.config.rank
    log.warning(
        "vigil: collectives not timed on rank %d: DDP's gradient all-reduces are invisible "
        "(%s), so a straggler cannot be named. Call vigil.init() before wrapping the model "
        "in DistributedDataParallel, and register communication hooks after it.",
        rank,
        reason,
    )
    try:
        client.event("collectives_untimed", rank=rank, what="ddp_gradients", reason=reason)
    except Exception:
        log.debug("vigil: could not report untimed collectives", exc_info=True)


def _python_builtin(comm_hook_type: Any) -> Any:
    """The Python equivalent of a built-in DDP hook (for after ours is registered)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    name = getattr(comm_hook_type, "name", str(comm_hook_type)).rsplit(".", 1)[-1]
    return {
        "ALLREDUCE": default_hooks.allreduce_hook,
        "FP16_COMPRESS": default_hooks.fp16_compress_hook,
    }.get(name)


def _first_forward(module: Any, args: Any) -> None:
    """Forward pre-hook, removed on first use: register our bucket hook unless the user
    registered one (DDP takes hooks before the first backward)."""
    if _compiling():
        return
    try:
        st = _ddp.get(module)
        if st is None:
            return
        handle, st.arm = st.arm, None
        if handle is not None:
            handle.remove()
        if st.user or st.slot is not None or collector.get_client() is None:
            return
        if getattr(module, "_use_python_reducer", False):
            return
        # A hook changes what DDP divides by under Join(divide_by_initial_world_size=False);
        # sparse gradients stay on the built-in path too.
        if getattr(module, "_divide_by_initial_world_size", True) is False or _sparse(module):
            return
        _install(module, st)
    except Exception:
        log.debug("vigil: could not register the DDP bucket hook", exc_info=True)


def _install(module: Any, st: _DdpState) -> None:
    """Register our timing bucket hook on the module's reducer (raises if torch refuses)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    label, members = _ddp_group(module)
    slot = _HookSlot(label, members, allreduce_hook, module.process_group)
    _dist._register_comm_hook(module.reducer, slot, _slot_hook)
    st.slot = slot


def _sparse(module: Any) -> bool:
    import torch

    kinds = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    return any(isinstance(m, kinds) and m.sparse for m in module.module.modules())


def _slot_hook(slot: _HookSlot, bucket: Any) -> Any:
    return _timed_bucket(slot.label, slot.members, slot.hook, slot.state, bucket)


def _timed_user_hook(module: Any, hook: Callable[..., Any]) -> Callable[..., Any]:
    label, members = _ddp_group(module)

    @functools.wraps(hook)
    def timed(state: Any, bucket: Any) -> Any:
        return _timed_bucket(label, members, hook, state, bucket)

    return timed


def _timed_bucket(
    label: str, members: list[int] | None, hook: Callable[..., Any], state: Any, bucket: Any
) -> Any:
    """Run a DDP comm hook as one ``all_reduce`` record that ends when its future does."""
    client = collector.get_client()
    if client is None or _state.outer is not None or _compiling():
        return hook(state, bucket)
    try:
        if not isinstance(bucket, _dist.GradBucket):  # the Python reducer passes (grad, param)
            return hook(state, bucket)
        call = client.collective_begin(label, "all_reduce", _tensor_bytes(bucket.buffer()), members)
    except Exception:
        log.debug("vigil: DDP bucket begin failed", exc_info=True)
        return hook(state, bucket)
    _state.outer, _state.objects = call, False
    try:
        future = hook(state, bucket)
    except BaseException:
        _state.outer = None
        _end(client, call)
        raise
    _state.outer = None
    try:
        return future.then(functools.partial(_end_then, client, call))
    except Exception:
        log.debug("vigil: DDP bucket future failed", exc_info=True)
        _end(client, call)
        return future


def _end_then(client: Client, call: Collective, future: Any) -> Any:
    """``then`` callback: the bucket's all-reduce is done; pass its value through. Runs
    before DDP sees the result, so a chaos delay here delays the backward pass."""
    _end(client, call)
    return future.value()

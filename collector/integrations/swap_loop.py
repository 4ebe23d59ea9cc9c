"""The collector's half of the activation-swap loop (issue 14): policies from Vigil, applied
at step boundaries, reported on the step records.

    vigil.init(swap=True)             # or VIGIL_SWAP=1; VIGIL_MEMORY_BUDGET_BYTES on CPU

With swap on, the client runs a ``SwapExecutor`` (``collector.integrations.swap``) as a step
listener and handles the ``apply_swap_policy`` action::

    params = {"policy": POLICY (detectors.swap), "shape_fp": "4be0…"}   # from the backend
    result = {"applied": True, "version": 3, "from_step": 57, "shape_fp": "4be0…",
              "peak_bytes": 1834496, "offloaded": 12}

The handler checks the policy (one that cannot be read fails the action with what is wrong;
nothing reaches the training thread), keeps it in a small cache keyed by ``shape_fp`` (a job
that alternates between sequence-length buckets keeps one policy per bucket) and waits until
a step has run under it. At each step start the policy in force is the one cached for the
shape the *previous* step ran (steady state; without shape fingerprints, the latest one
received): policies switch only at step boundaries. A step whose saved storages do not match
the policy is run without it (``skipped``); when that step ran the very shape the policy was
sent for, the policy cannot fit that shape: it is dropped and its action fails.

Each step record gets ``swap_policy`` (the version it ran under; absent when none, skipped or
standing aside) and ``swap_peak_bytes`` (the executor's accounted peak). On CPU every step is
accounted, with or without a policy, and that account (parameters, gradients and optimizer
state plus the saved storages on the "device", what ``detectors.swap.simulate`` models) is
the step's ``mem_bytes``, comparable with the heartbeat's ``mem_capacity``
(``VIGIL_MEMORY_BUDGET_BYTES``). On CUDA ``mem_bytes`` stays the allocator's peak and steps
without a policy run without hooks.

The op-sequence capture (``opseq.py``, ``profile.py``) also uses saved-tensor hooks. Its
listener is registered first, so it decides first; on a step it captures, the executor
stands aside (no policy, no account: ``mem_bytes`` is sent empty on CPU), so the profile
sees the step as it runs unmodified.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from collector.client import Client, StepListener
from collector.integrations.swap import SwapExecutor, check_policy

log = logging.getLogger("vigil.collector")

__all__ = ["APPLY_WAIT_S", "MAX_POLICIES", "SwapLoop", "setup_once"]

MAX_POLICIES = 16  # policies cached (one per shape), least recently received dropped first
APPLY_WAIT_S = 60.0  # how long an apply_swap_policy action waits for a step to run it
BASE_REFRESH_STEPS = 100  # parameter/optimizer bytes are summed again this often


def setup_once(client: Client) -> SwapLoop | None:
    """Attach a ``SwapLoop`` to ``client`` when its config asks for swapping (once)."""
    if not client.config.swap:
        return None
    existing = next((x for x in client._listeners if isinstance(x, SwapLoop)), None)
    if existing is not None:
        return existing
    from collector.integrations import profile

    profile.setup_once()  # remembers optimizers as they step: their bytes are the base
    loop = SwapLoop(client)
    client.add_step_listener(loop)
    client.register_action("apply_swap_policy", loop.apply_swap_policy)
    return loop


@dataclass
class _Waiter:
    """An ``apply_swap_policy`` action waiting for the first step run under its policy."""

    policy: dict[str, Any]
    shape: str | None
    done: threading.Event = field(default_factory=threading.Event)
    result: dict[str, Any] | None = None
    error: str | None = None


class SwapLoop(StepListener):
    """The executor, the policy cache and the actions waiting on them (module docstring)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.executor = SwapExecutor(account=True)
        self.cache: OrderedDict[str | None, dict[str, Any]] = OrderedDict()
        self.latest: dict[str, Any] | None = None
        self.last_shape: str | None = None  # the shape the last step ran
        self.in_force: dict[str, Any] | None = None  # what the executor was given
        self.aside = False  # this step: the op-sequence capture runs, the executor does not
        self.capture: Any = None  # … and this is it
        self.running = False  # this step: the executor runs (hooks in place)
        self.waiters: list[_Waiter] = []
        self.lock = threading.Lock()
        self.opseq = _opseq_listener(client)
        self._base_key: tuple[Any, ...] = ()
        self._base_age = BASE_REFRESH_STEPS

    # -- the action (an action thread) ---------------------------------------------------

    def apply_swap_policy(self, params: dict[str, Any]) -> dict[str, Any]:
        """Handler of ``apply_swap_policy``: cache the policy, wait for a step to run it."""
        policy, shape = params.get("policy"), params.get("shape_fp")
        if shape is not None and not isinstance(shape, str):
            raise ValueError(f"shape_fp must be a string, not {type(shape).__name__}")
        version = check_policy(policy)  # a ValueError names what is wrong
        assert isinstance(policy, dict)
        waiter = _Waiter(policy, shape)
        with self.lock:
            for old in self.waiters:
                if old.shape == shape:
                    old.error = f"superseded by policy v{version} before a step ran it"
                    old.done.set()
            self.waiters = [w for w in self.waiters if not w.done.is_set()] + [waiter]
            self.cache.pop(shape, None)
            self.cache[shape] = policy
            while len(self.cache) > MAX_POLICIES:
                self.cache.popitem(last=False)
            self.latest = policy
        if not waiter.done.wait(APPLY_WAIT_S):
            with self.lock:
                if waiter in self.waiters:
                    self.waiters.remove(waiter)
            raise TimeoutError(
                f"policy v{version} is kept for shape {shape}, but no step ran it within "
                f"{APPLY_WAIT_S:.0f} s"
            )
        if waiter.error is not None:
            raise RuntimeError(waiter.error)
        assert waiter.result is not None
        return waiter.result

    # -- steps (the training thread) -----------------------------------------------------

    def on_step_start(self, step: int) -> None:
        self.running = False
        self.capture = self.opseq.capture if self.opseq is not None else None
        self.aside = self.capture is not None
        if self.aside:
            return  # the capture's saved-tensor hooks are in place: never both
        with self.lock:
            if self.last_shape is None:
                policy = self.latest
            else:
                policy = self.cache.get(self.last_shape, self.cache.get(None))
        ex = self.executor
        if policy is not self.in_force:
            self.in_force = policy
            if not ex.set_policy(policy):  # checked when received: should not happen
                self._drop(policy, "the executor refused it")
                self.in_force = None
                ex.set_policy(None)
        ex.account = not _cuda_in_use()
        if ex.account and policy is None:
            ex.base_bytes = self._base_bytes()
        ex.on_step_start(step)
        self.running = True

    def on_step_end(self, step: int) -> None:
        shape = _step_field(self.client, "shape_fp")
        try:
            if self.aside:
                if not _cuda_in_use():
                    self.client.set_step_fields(mem_bytes=None)  # no account this step
                self._learn_params(self.capture)
            elif self.running:
                self._report(step, shape, self.executor.on_step_end(step))
        finally:
            self.last_shape = shape if isinstance(shape, str) else None
            self.running = self.aside = False
            self.capture = None

    def _report(self, step: int, shape: Any, report: dict[str, Any]) -> None:
        fields: dict[str, Any] = {}
        peak = report.get("peak_bytes")
        if peak is not None:
            fields["swap_peak_bytes"] = peak
        version = report.get("policy_version")
        applied = version is not None and not report.get("skipped") and not report.get("failed")
        if applied:
            fields["swap_policy"] = version
        if "cuda_peak_bytes" not in report and not _cuda_in_use():
            fields["mem_bytes"] = peak
        self.client.set_step_fields(**fields)
        policy = self.in_force
        if policy is None or version is None:
            return
        if applied:
            self._resolve(policy, step, report)
        elif (
            shape is not None
            and "storages" in report
            and report.get("skipped")
            and (self.cache.get(shape) is policy)
        ):
            # It ran on a step of the very shape it was sent for, and did not fit.
            self._drop(policy, f"its saved storages do not match the steps of shape {shape}")

    def _resolve(self, policy: dict[str, Any], step: int, report: dict[str, Any]) -> None:
        with self.lock:
            done = [w for w in self.waiters if w.policy is policy]
            if not done:
                return
            self.waiters = [w for w in self.waiters if w.policy is not policy]
        for w in done:
            w.result = {
                "applied": True,
                "version": report.get("policy_version"),
                "from_step": step,
                "shape_fp": w.shape,
                "peak_bytes": report.get("peak_bytes"),
                "offloaded": report.get("offloaded"),
            }
            w.done.set()

    def _drop(self, policy: dict[str, Any] | None, why: str) -> None:
        """Forget a policy that cannot be applied and fail the actions waiting on it."""
        if policy is None:
            return
        with self.lock:
            for key in [k for k, p in self.cache.items() if p is policy]:
                del self.cache[key]
            if self.latest is policy:
                self.latest = None
            done = [w for w in self.waiters if w.policy is policy]
            self.waiters = [w for w in self.waiters if w.policy is not policy]
        version = policy.get("version")
        log.warning("vigil: swap policy v%s dropped: %s", version, why)
        for w in done:
            w.error = f"policy v{version} was not applied: {why}"
            w.done.set()

    def _learn_params(self, capture: Any) -> None:
        """Parameters' and buffers' storages, as the capture's profile marks them."""
        ptrs = getattr(capture, "param_ptrs", None)
        if ptrs:
            self.executor.param_ptrs = frozenset(ptrs)

    def _base_bytes(self) -> int:
        """Parameters, gradients and optimizer state (``detectors.swap``'s base), from the
        optimizers seen stepping; summed again when their state grows, else every
        ``BASE_REFRESH_STEPS`` steps."""
        from collector.integrations.profile import _optimizers

        optimizers = list(_optimizers)
        key = tuple((id(o), len(o.state)) for o in optimizers)
        self._base_age += 1
        if key != self._base_key or self._base_age >= BASE_REFRESH_STEPS:
            self._base_key, self._base_age = key, 0
            self.executor.base_bytes = _optimizer_bytes(optimizers)
        return self.executor.base_bytes


def _optimizer_bytes(optimizers: list[Any]) -> int:
    from collector.integrations.profile import _nbytes, _unique

    params = _unique(p for o in optimizers for g in o.param_groups for p in g["params"])
    states = _unique(
        t
        for o in optimizers
        for state in o.state.values()
        for t in (state.values() if isinstance(state, dict) else ())
        if hasattr(t, "untyped_storage")
    )
    grads = [p for p in params if p.requires_grad]
    return _nbytes(params) + _nbytes(grads) + _nbytes(states)


def _opseq_listener(client: Client) -> Any:
    """The client's op-sequence listener, which must come before ours (it decides first)."""
    from collector.integrations.opseq import OpSeqListener

    return next((x for x in client._listeners if isinstance(x, OpSeqListener)), None)


def _step_field(client: Client, name: str) -> Any:
    cur = client._current
    return cur.fields.get(name) if cur is not None else None


def _cuda_in_use() -> bool:
    import torch

    cuda: Any = torch.cuda
    return bool(cuda.is_available() and cuda.is_initialized())

"""Vigil's in-process collector.

    import collector as vigil

    vigil.init(job="llama-8b-pretrain")          # or VIGIL_ENDPOINT / VIGIL_TOKEN / VIGIL_JOB
    for step, batch in enumerate(loader):
        with vigil.step(step):                   # optional: optimizer.step() is hooked too
            loss = train_step(batch)
        vigil.log(loss=loss.item())

    @vigil.on_action("checkpoint_now")
    def save(params):
        torch.save(model.state_dict(), params.get("path", "ckpt.pt"))
        return {"saved": True}

It is a guest in someone else's process: standard library only (torch when the job has
it), never imports the backend, never raises into user code, never blocks a step. Before
``init()``, or without an endpoint, every call is a near-free no-op.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ParamSpec, TypeVar

from collector import serving
from collector.actions import ActionHandler
from collector.client import Client
from collector.config import Config

__all__ = [
    "Config",
    "event",
    "flush",
    "get_client",
    "init",
    "log",
    "on_action",
    "request",
    "serving",
    "shutdown",
    "stats",
    "step",
    "wrap_loader",
]
__version__ = "0.1.0"

log_ = logging.getLogger("vigil.collector")
_client: Client | None = None
_client_key: tuple[Client, Config, bool] | None = None  # a client and its settings
_init_lock = threading.Lock()
_NOOP = contextlib.nullcontext()
P = ParamSpec("P")
R = TypeVar("R")


def _guard(default: Any = None) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Swallow and log any exception: the collector must never break the training job."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def inner(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return fn(*args, **kwargs)
            except Exception:
                log_.warning("vigil: %s failed; continuing without it", fn.__name__, exc_info=True)
                return default  # type: ignore[no-any-return]

        return inner

    return wrap


@_guard(default=False)
def init(
    job: str | None = None,
    endpoint: str | None = None,
    token: str | None = None,
    *,
    kind: str | None = None,
    integrations: bool = True,
    **options: Any,
) -> bool:
    """Start collecting. Returns False (and stays a no-op) without an endpoint.

    ``options`` override any ``Config`` field (``heartbeat_s``, ``opseq_every``, …);
    ``swap=True`` applies the activation-swap policies Vigil sends
    (``collector.integrations.swap_loop``). Calling it again with other settings replaces
    the previous client; with the same ones it keeps it (a script that calls ``init()``
    under ``vigil run``, which initialised it already, must not look like a rank that left).
    """
    global _client, _client_key
    config = Config.resolve(job=job, endpoint=endpoint, token=token, kind=kind, **options)
    with _init_lock:
        if _client is not None and _client_key == (_client, config, integrations):
            return True
        if _client is not None:
            _client.shutdown(0.5)
            _client = None
        if not config.enabled:
            return False
        client = Client(config)
        for kind_, handler in _handlers.items():
            client.register_action(kind_, handler)
        if integrations:
            from collector.integrations import setup_integrations

            setup_integrations(client)
        if config.swap:  # after the op-sequence listener: it decides first (swap_loop.py)
            _setup_swap(client)
        _client, _client_key = client, (client, config, integrations)
    log_.info("vigil: rank %d of job %r reporting to %s", config.rank, config.job, config.endpoint)
    return True


def _setup_swap(client: Client) -> None:
    try:
        from collector.integrations import swap_loop

        swap_loop.setup_once(client)
    except Exception:  # torch missing or broken: the job runs on without swapping
        log_.warning("vigil: activation swapping could not start", exc_info=True)


def get_client() -> Client | None:
    return _client


def step(n: int | None = None) -> contextlib.AbstractContextManager[None]:
    """Mark one training step: ``with vigil.step(n): …``. Numbered from 0 if ``n`` is None."""
    client = _client
    if client is None:
        return _NOOP
    try:
        return _GuardedStep(client, n)
    except Exception:
        return _NOOP


class _GuardedStep:
    __slots__ = ("client", "n")

    def __init__(self, client: Client, n: int | None) -> None:
        self.client, self.n = client, n

    def __enter__(self) -> None:
        try:
            c = self.client
            c._explicit_steps = True
            n = c._next_step if self.n is None else self.n
            c._next_step = n + 1
            c.begin_step(n)
        except Exception:
            log_.debug("vigil: step start failed", exc_info=True)

    def __exit__(self, *exc: object) -> None:
        try:
            self.client.end_step()
        except Exception:
            log_.debug("vigil: step end failed", exc_info=True)


@_guard()
def log(step: int | None = None, **metrics: Any) -> None:
    """Record metrics. ``loss``, ``grad_norm`` and ``tokens`` join the step record; others
    are shipped as metric events. Tensors are read with ``.item()``."""
    client = _client
    if client is not None:
        client.log(step, **metrics)


def on_action(kind: str) -> Callable[[ActionHandler], ActionHandler]:
    """Register a handler for actions of ``kind`` sent by the backend.

    The handler gets the action's params and returns a dict reported back as its result.
    Registered before ``init()``, it is kept for when the client starts.
    """

    def register(fn: ActionHandler) -> ActionHandler:
        _handlers[kind] = fn
        client = _client
        if client is not None:
            client.register_action(kind, fn)
        return fn

    return register


_handlers: dict[str, ActionHandler] = {}


@_guard()
def request(
    id: str,
    arrival: float,
    first_token: float | None = None,
    end: float | None = None,
    *,
    prompt_tokens: int | None = None,
    output_tokens: int | None = None,
    max_tbt_s: float | None = None,
    status: str = "ok",
) -> None:
    """Record one served request (times in seconds, any consistent clock)."""
    client = _client
    if client is None:
        return
    event: dict[str, Any] = {
        "type": "request",
        "id": str(id),
        "arrival": float(arrival),
        "status": status,
    }
    for key, value in (("first_token", first_token), ("end", end), ("max_tbt_s", max_tbt_s)):
        if value is not None:
            event[key] = float(value)
    for key, count in (("prompt_tokens", prompt_tokens), ("output_tokens", output_tokens)):
        if count is not None:
            event[key] = int(count)
    client.submit(event)


@_guard()
def event(name: str, **attrs: Any) -> None:
    """Record a named event (``checkpoint_saved``, …) at the current step."""
    client = _client
    if client is not None:
        client.event(name, **attrs)


def wrap_loader(iterable: Iterable[R]) -> Iterator[R]:
    """Yield from ``iterable``, counting the time spent waiting for each item as the
    step's ``data_s``. (torch DataLoaders are timed automatically.)"""
    import time

    it = iter(iterable)
    while True:
        started = time.perf_counter()
        try:
            item = next(it)
        except StopIteration:
            return
        client = _client
        if client is not None:
            client.add_data_wait(time.perf_counter() - started)
        yield item


@_guard(default=False)
def flush(timeout: float | None = None) -> bool:
    """Send what is buffered now; True if it was delivered within ``timeout``."""
    client = _client
    return client.flush(timeout) if client is not None else True


def stats() -> dict[str, Any]:
    """What the collector delivered and what it gave up, for logs and tests::

        {"sent_batches": 120, "sent_events": 3410, "buffered": 12,
         "dropped": {"buffer_full": 300, "rejected": 1},   # events, by reason
         "set_aside_batches": 1,                           # batches the server would not take
         "last_error": "http 422: [{\"field\": \"events[7].name\", …}]"}

    Drop reasons: ``queue_full`` (handed over faster than the worker takes), ``buffer_full``
    (the oldest telemetry, while the server was unreachable), ``rejected`` (refused with a
    4xx), ``failed`` (failed while the server took other requests), ``unencodable``,
    ``bad_metric``, ``shutdown``. The same counts ride along with every heartbeat.
    """
    client = _client
    if client is None:
        return dict(_NO_STATS, dropped={})
    try:
        return client.stats()
    except Exception:
        log_.debug("vigil: stats failed", exc_info=True)
        return dict(_NO_STATS, dropped={})


_NO_STATS: dict[str, Any] = {
    "sent_batches": 0,
    "sent_events": 0,
    "buffered": 0,
    "set_aside_batches": 0,
    "last_error": None,
}


@_guard()
def shutdown(timeout: float | None = None) -> None:
    """Flush and stop the background thread (also done at interpreter exit)."""
    global _client
    client, _client = _client, None
    if client is not None:
        client.shutdown(timeout)

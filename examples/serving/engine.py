"""Continuous batching: one engine thread runs the model over a running batch of requests.

    engine = Engine(TinyLM(ModelConfig()), max_batch=16, deliver=on_events)
    engine.start()
    seq = Sequence(id="r1", prompt=torch.tensor([5, 9, 2]), max_tokens=32, ignore_eos=True)
    engine.submit(seq)           # joins the batch between two steps
    ...                          # on_events([(seq, Token(" kava")), …, (seq, Done("length"))])
    seq.cancelled = True         # the client went away: it leaves at the next step
    engine.stop()

Each iteration of the loop:

1. admits waiting sequences while fewer than ``max_batch`` run (each takes a KV-cache slot);
2. prefills: up to ``prefill_budget`` prompt tokens, in chunks of at most one attention
   window, oldest sequence first; a sequence whose prompt is done samples its first token;
3. runs one decode step over every sequence past its prefill, in one batched forward pass;
4. retires finished and cancelled sequences (their slots are reused at once), and hands the
   step's tokens to ``deliver`` in one call (the server moves them onto its event loop).

So new requests join between decode steps and finished ones leave, and a long prompt is
prefilled a chunk per iteration while the others keep decoding (their time between tokens
grows meanwhile, as on a real server). The torch work releases the GIL, so the HTTP server
keeps streaming while a step runs. ``chaos`` (see :mod:`examples.serving.chaos`) can slow
every step or stall the loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from examples.serving.model import EOS, KVCache, TinyLM

log = logging.getLogger("examples.serving")


@dataclass(frozen=True)
class Token:
    token: int


@dataclass(frozen=True)
class Done:
    finish_reason: str  # "length" or "stop"


@dataclass(frozen=True)
class Failed:
    message: str


Event = Token | Done | Failed


@dataclass(eq=False)
class Sequence:
    """One request inside the engine. ``sink`` is the server's, the engine never reads it."""

    id: str
    prompt: torch.Tensor  # token ids, int64
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 1.0
    sink: Any = None
    cancelled: bool = False
    # engine state
    slot: int = -1
    prefilled: int = 0  # prompt tokens in the cache
    output: int = 0  # tokens generated
    last: int = EOS  # the token to feed next
    finish: str | None = None
    # wall-clock times (time.time()), for the server's request log
    arrival: float = field(default_factory=time.time)
    scheduled: float | None = None
    first_token: float | None = None
    end: float | None = None

    @property
    def prompt_tokens(self) -> int:
        return int(self.prompt.shape[0])


@dataclass
class EngineStats:
    steps: int = 0  # decode steps
    prefill_chunks: int = 0
    tokens: int = 0  # output tokens generated
    max_batch_seen: int = 0
    finished: int = 0


class Engine:
    def __init__(
        self,
        model: TinyLM,
        *,
        max_batch: int = 16,
        prefill_budget: int | None = None,
        deliver: Callable[[list[tuple[Sequence, Event]]], None],
        chaos: Any = None,
        seed: int = 0,
        step_floor_s: float = 0.0,
    ) -> None:
        self.model = model
        self.step_floor_s = step_floor_s
        self.max_batch = max_batch
        self.window = model.config.window
        self.prefill_budget = prefill_budget or self.window
        self.cache = KVCache(model.config, slots=max_batch)
        self.deliver = deliver
        self.chaos = chaos
        self.stats = EngineStats()
        self.finished_log: deque[Sequence] = deque(maxlen=10_000)
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []  # in arrival order (prefill is first come first served)
        # Slot table. Invariant: the sequences that decode hold slots 0 … _decoding - 1, so
        # a decode step reads the KV cache in place; those still in prefill hold later slots.
        self._slots: list[Sequence | None] = [None] * max_batch
        self._decoding = 0
        self._wake = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self._gen = torch.Generator().manual_seed(seed)

    # -- the server's side -----------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        self._thread.join(timeout)

    def submit(self, seq: Sequence) -> None:
        with self._wake:
            self._waiting.append(seq)
            self._wake.notify()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    # -- the loop --------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stop and not self._waiting and not self._running:
                    self._wake.wait()
                if self._stop:
                    return
                self._admit()
            try:
                with torch.inference_mode():
                    self._iteration()
            except Exception as exc:  # a bug must not leave clients waiting forever
                log.exception("engine step failed")
                events: list[tuple[Sequence, Event]] = [
                    (s, Failed(f"engine error: {exc}")) for s in self._running
                ]
                self._running = []
                self._slots = [None] * self.max_batch
                self._decoding = 0
                self.deliver(events)

    def _admit(self) -> None:
        now = time.time()
        while self._waiting and len(self._running) < self.max_batch:
            seq = self._waiting.popleft()
            if seq.cancelled:
                continue
            seq.slot = self._slots.index(None)  # always past the decoding slots
            self._slots[seq.slot] = seq
            seq.scheduled = now
            self._running.append(seq)

    def _iteration(self) -> None:
        if self.chaos is not None:
            self.chaos.before_step()
        started = time.perf_counter()
        events: list[tuple[Sequence, Event]] = []
        self._prefill(events)
        self._decode(events)
        self._retire(events)
        if events:
            self.deliver(events)
        took = time.perf_counter() - started
        if events and took < self.step_floor_s:  # paced like an accelerator's decode step
            time.sleep(self.step_floor_s - took)
            took = self.step_floor_s
        if self.chaos is not None:
            self.chaos.after_step(took)

    def _prefill(self, events: list[tuple[Sequence, Event]]) -> None:
        budget = self.prefill_budget
        for seq in self._running:
            if budget <= 0:
                break
            while seq.prefilled < seq.prompt_tokens and budget > 0 and not seq.cancelled:
                n = min(self.window, budget, seq.prompt_tokens - seq.prefilled)
                chunk = seq.prompt[seq.prefilled : seq.prefilled + n]
                logits = self.model.prefill(
                    self.cache, slot=seq.slot, tokens=chunk, start=seq.prefilled
                )
                seq.prefilled += n
                budget -= n
                self.stats.prefill_chunks += 1
                if seq.prefilled == seq.prompt_tokens:
                    token = int(self._sample(logits[None], [seq])[0])
                    seq.first_token = time.time()
                    self._emit(seq, token, events)
                    if seq.finish is None:
                        self._join_decoding(seq)

    def _join_decoding(self, seq: Sequence) -> None:
        """Move a sequence whose prefill is done to the first slot after the decoding ones."""
        dst = self._decoding
        other = self._slots[dst]
        if seq.slot != dst:
            if other is None:
                self.cache.move(seq.slot, dst)
                self._slots[seq.slot] = None
            else:  # a sequence still in prefill: trade places
                self.cache.swap(seq.slot, dst)
                self._slots[seq.slot], other.slot = other, seq.slot
            self._slots[dst], seq.slot = seq, dst
        self._decoding += 1

    def _decode(self, events: list[tuple[Sequence, Event]]) -> None:
        batch: list[Sequence] = self._slots[: self._decoding]  # type: ignore[assignment]
        if not batch:
            return
        logits = self.model.decode(
            self.cache,
            tokens=[s.last for s in batch],
            positions=[s.prompt_tokens + s.output - 1 for s in batch],
        )
        for seq, token in zip(batch, self._sample(logits, batch).tolist(), strict=True):
            self._emit(seq, token, events)
        self.stats.steps += 1
        self.stats.max_batch_seen = max(self.stats.max_batch_seen, len(batch))

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """One token per row: greedy at temperature 0, else sampled; never EOS for a
        sequence that ignores it."""
        no_eos = [i for i, s in enumerate(seqs) if s.ignore_eos]
        if no_eos:
            logits[no_eos, EOS] = float("-inf")
        temps = torch.tensor([max(s.temperature, 1e-6) for s in seqs])[:, None]
        probs = torch.softmax(logits / temps, dim=-1)
        sampled = torch.multinomial(probs, 1, generator=self._gen)[:, 0]
        greedy = [i for i, s in enumerate(seqs) if s.temperature <= 0]
        if greedy:
            sampled[greedy] = logits[greedy].argmax(dim=-1)
        return sampled

    def _emit(self, seq: Sequence, token: int, events: list[tuple[Sequence, Event]]) -> None:
        if token == EOS and not seq.ignore_eos:
            seq.finish = "stop"
            return
        seq.output += 1
        seq.last = token
        self.stats.tokens += 1
        events.append((seq, Token(token)))
        if seq.output >= seq.max_tokens:
            seq.finish = "length"

    def _retire(self, events: list[tuple[Sequence, Event]]) -> None:
        keep = []
        now = time.time()
        for seq in self._running:
            if seq.finish is None and not seq.cancelled:
                keep.append(seq)
                continue
            self._release(seq)
            seq.end = now
            if seq.finish is not None:
                events.append((seq, Done(seq.finish)))
                self.stats.finished += 1
            self.finished_log.append(seq)
        self._running = keep

    def _release(self, seq: Sequence) -> None:
        """Free a sequence's slot; the last decoding sequence fills a hole it leaves."""
        slot = seq.slot
        self._slots[slot] = None
        if slot < self._decoding:
            last = self._decoding - 1
            if slot != last:
                mover = self._slots[last]
                assert mover is not None
                self.cache.move(last, slot)
                self._slots[slot], self._slots[last], mover.slot = mover, None, slot
            self._decoding -= 1

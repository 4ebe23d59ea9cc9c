"""The example server's continuous-batching engine, driven directly (no HTTP): what a
sequence generates does not depend on what else shares its batch, however requests join,
leave, wait for a slot or are cancelled; long prompts are prefilled in chunks; EOS."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest
import torch
from torch import nn

from examples.serving.engine import Done, Engine, Event, Failed, Sequence, Token
from examples.serving.model import EOS, ModelConfig, TinyLM, Tokenizer


class Outputs:
    """``deliver`` for the engine: keeps every sequence's tokens and how it ended."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = defaultdict(list)
        self.ended: dict[str, str] = {}
        self.cancel_after: dict[str, int] = {}
        self._cv = threading.Condition()

    def deliver(self, events: list[tuple[Sequence, Event]]) -> None:
        with self._cv:
            for seq, event in events:
                if isinstance(event, Token):
                    self.tokens[seq.id].append(event.token)
                    if len(self.tokens[seq.id]) == self.cancel_after.get(seq.id):
                        seq.cancelled = True  # the engine thread: exactly after n tokens
                        self.ended[seq.id] = "cancelled"
                elif isinstance(event, Done):
                    self.ended[seq.id] = event.finish_reason
                elif isinstance(event, Failed):
                    self.ended[seq.id] = f"failed: {event.message}"
            self._cv.notify_all()

    def wait(self, ids: list[str], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        with self._cv:
            while not all(i in self.ended for i in ids):
                left = deadline - time.monotonic()
                assert left > 0, f"not finished: {set(ids) - set(self.ended)}"
                self._cv.wait(left)


def run(
    model: TinyLM, seqs: list[Sequence], *, max_batch: int, cancel: dict[str, int] | None = None
):  # type: ignore[no-untyped-def]
    out = Outputs()
    out.cancel_after = cancel or {}
    engine = Engine(model, max_batch=max_batch, deliver=out.deliver)
    engine.start()
    try:
        for seq in seqs:
            engine.submit(seq)
        out.wait([s.id for s in seqs])
    finally:
        engine.stop()
    return out, engine


def seq(id: str, prompt_len: int, max_tokens: int, **kw: object) -> Sequence:
    prompt = Tokenizer(384).synthetic(prompt_len).roll(len(id))  # different prompts
    return Sequence(id=id, prompt=prompt, max_tokens=max_tokens, temperature=0.0, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def model() -> TinyLM:
    torch.set_num_threads(1)
    return TinyLM(ModelConfig())


SCENARIOS = {
    # Three slots for six requests: they wait, join mid-way through the others' decoding, a
    # long prompt (b) is prefilled in chunks while others decode, x is cancelled after 7
    # tokens (its slot is reused), y finishes with its first token.
    "join-leave-cancel": (
        3,
        {"a": (40, 60), "b": (600, 30), "c": (5, 10), "x": (20, 40), "y": (30, 1), "d": (300, 25)},
    ),
    # d leaves slot 0 while l is still in prefill in slot 1; s takes slot 0; l finishes its
    # prefill first and trades slots with s (the decoding slots stay contiguous).
    "prefill-swap": (2, {"d": (5, 2), "l": (700, 20), "s": (5, 20)}),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_what_a_sequence_generates_does_not_depend_on_its_batch(model: TinyLM, scenario: str):
    max_batch, specs = SCENARIOS[scenario]
    alone = {}
    for name, (p, n) in specs.items():
        out, _ = run(model, [seq(name, p, n, ignore_eos=True)], max_batch=1)
        alone[name] = out.tokens[name]
    together, engine = run(
        model,
        [seq(name, p, n, ignore_eos=True) for name, (p, n) in specs.items()],
        max_batch=max_batch,
        cancel={"x": 7},
    )
    assert together.ended == {n: "cancelled" if n == "x" else "length" for n in specs}
    for name in specs:
        expected = alone[name][:7] if name == "x" else alone[name]
        assert together.tokens[name][: len(expected)] == expected, name
    assert engine.stats.max_batch_seen == max_batch
    assert engine.running == 0 and engine.waiting == 0


def test_long_prompts_are_prefilled_a_window_at_a_time(model: TinyLM):
    out, engine = run(model, [seq("long", 1000, 3, ignore_eos=True)], max_batch=2)
    assert engine.stats.prefill_chunks == 4  # 256 + 256 + 256 + 232
    assert len(out.tokens["long"]) == 3
    assert engine.stats.steps == 2  # the first token comes from the prefill


class EosFirst(nn.Module):
    """An output layer that makes end-of-sequence by far the likeliest token."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.head(x)
        logits[..., EOS] += 1e4
        return logits


def test_eos_ends_a_sequence_unless_it_is_ignored():
    model = TinyLM(ModelConfig())
    model.head = EosFirst(model.head)  # type: ignore[assignment]
    out, _ = run(
        model,
        [
            Sequence(id="stops", prompt=torch.tensor([5, 6]), max_tokens=20),
            Sequence(id="goes", prompt=torch.tensor([5, 6]), max_tokens=20, ignore_eos=True),
        ],
        max_batch=2,
    )
    assert out.ended == {"stops": "stop", "goes": "length"}
    assert out.tokens["stops"] == []
    assert len(out.tokens["goes"]) == 20 and EOS not in out.tokens["goes"]

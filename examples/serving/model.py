"""A small GPT-style language model with a slot-based KV cache, for the example server.

    model = TinyLM(ModelConfig())                 # random weights, seeded: same in every process
    cache = KVCache(model.config, slots=16)
    logits = model.prefill(cache, slot=0, tokens=torch.tensor([5, 9, 2]), start=0)
    logits = model.decode(cache, tokens=[7], positions=[3])     # the sequence in slot 0

Nothing is trained and nothing is downloaded: the weights are random (``seed``), so the
text is nonsense, but the arithmetic per token is that of a real decoder. Attention is
*sliding-window* (as in Mistral): a token sees at most the last ``window`` positions, so the
KV cache of a sequence is a ring buffer of ``window`` entries however long its prompt, and
prefill costs time proportional to the prompt's length. Positions are added as sinusoids
(unbounded, no position table). A decode step for a batch of 16 takes a few milliseconds
on one CPU core.

The tokenizer is one token per whitespace-separated word: a word of the vocabulary gets its
own id, any other word a stable id from its CRC-32, so a prompt of N words is N tokens.
Token 0 is end-of-sequence.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn
from torch.nn import functional as F

EOS = 0


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 384
    dim: int = 128
    layers: int = 2
    heads: int = 4
    window: int = 256  # sliding attention window, and the KV ring buffer's length
    seed: int = 0


def make_vocabulary(size: int) -> list[str]:
    """``size`` pronounceable words; index 0 is the end-of-sequence marker."""
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    syllables = [c + v for c in consonants for v in vowels]
    words = [a + b for a in syllables for b in syllables]
    step = 7919  # a prime: spreads the picks over the syllable pairs
    picked = [words[(i * step) % len(words)] for i in range(size - 1)]
    return ["<eos>", *picked]


class Tokenizer:
    def __init__(self, vocab: int) -> None:
        self.words = make_vocabulary(vocab)
        self.ids = {w: i for i, w in enumerate(self.words) if i != EOS}

    def encode(self, text: str) -> list[int]:
        n = len(self.words) - 1
        return [self.ids.get(w) or zlib.crc32(w.encode()) % n + 1 for w in text.split()]

    def piece(self, token: int) -> str:
        """The text of one output token (a word with its leading space)."""
        return "" if token == EOS else " " + self.words[token]

    def synthetic(self, n: int) -> torch.Tensor:
        """A prompt of ``n`` tokens, for requests that give only a token count."""
        return torch.arange(n, dtype=torch.long).mul_(7919).remainder_(len(self.words) - 1) + 1


def sinusoids(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Absolute position encodings (Vaswani et al.) for any positions: ``[n, dim]``."""
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float32) * (-math.log(10_000.0) / half))
    angle = positions.to(torch.float32)[:, None] * freq[None, :]
    return torch.cat([angle.sin(), angle.cos()], dim=-1)


class KVCache:
    """Per-slot ring buffers of keys and values: ``[layers, slots, heads, window, head_dim]``.

    Position ``p`` of the sequence in a slot lives at index ``p % window``."""

    def __init__(self, config: ModelConfig, slots: int) -> None:
        hd = config.dim // config.heads
        shape = (config.layers, slots, config.heads, config.window, hd)
        self.k = torch.zeros(shape)
        self.v = torch.zeros(shape)
        self.window = config.window

    def move(self, src: int, dst: int) -> None:
        """Copy slot ``src`` into slot ``dst``."""
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]

    def swap(self, a: int, b: int) -> None:
        for t in (self.k, self.v):
            t[:, [a, b]] = t[:, [b, a]]


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.out(F.gelu(self.fc(self.ln2(x))))
        return out


class TinyLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.dim % config.heads:
            raise ValueError("dim must be a multiple of heads")
        self.config = config
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(config.seed)
        self.tok = nn.Embedding(config.vocab, config.dim)
        self.blocks = nn.ModuleList(Block(config.dim, config.heads) for _ in range(config.layers))
        self.ln = nn.LayerNorm(config.dim)
        self.head = nn.Linear(config.dim, config.vocab, bias=False)
        torch.random.set_rng_state(generator_state)
        self.eval()
        self.requires_grad_(False)

    def _blocks(self) -> list[Block]:
        return [cast(Block, b) for b in self.blocks]

    @torch.inference_mode()
    def prefill(
        self, cache: KVCache, *, slot: int, tokens: torch.Tensor, start: int
    ) -> torch.Tensor:
        """Run a chunk of a prompt (at most ``window`` tokens, positions ``start`` on)
        through the model, filling the slot's cache; the next-token logits ``[vocab]``.

        The chunk attends to the slot's cached window before it and causally to itself."""
        c = self.config
        n, hd, w = tokens.shape[0], c.dim // c.heads, cache.window
        if n > w:
            raise ValueError("a prefill chunk is at most one window long")
        positions = torch.arange(start, start + n)
        x = self.tok(tokens) + sinusoids(positions, c.dim)
        prior = min(start, w)  # valid cached entries
        mask = torch.ones(n, prior + n, dtype=torch.bool)
        mask[:, prior:] = torch.ones(n, n, dtype=torch.bool).tril_()
        ring = positions % w
        for layer, block in enumerate(self._blocks()):
            q, k, v = block.qkv(block.ln1(x)).view(n, 3, c.heads, hd).permute(1, 2, 0, 3)
            keys = torch.cat([cache.k[layer, slot, :, :prior], k], dim=1)
            values = torch.cat([cache.v[layer, slot, :, :prior], v], dim=1)
            att = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            x = x + block.proj(att.transpose(0, 1).reshape(n, c.dim))
            x = x + block.mlp(x)
            cache.k[layer, slot][:, ring] = k
            cache.v[layer, slot][:, ring] = v
        logits: torch.Tensor = self.head(self.ln(x[-1]))
        return logits

    @torch.inference_mode()
    def decode(self, cache: KVCache, *, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """One decode step for the sequences in slots ``0 … len(tokens) - 1``: sequence ``i``
        takes ``tokens[i]`` at ``positions[i]``. Returns the next-token logits ``[b, vocab]``.

        The batch's slots are contiguous so that attention reads the cache in place."""
        c = self.config
        b, hd, w = len(tokens), c.dim // c.heads, cache.window
        rows = torch.arange(b)
        pos = torch.tensor(positions)
        ring = pos % w
        valid = torch.clamp(pos + 1, max=w)
        mask = (torch.arange(w)[None, :] < valid[:, None])[:, None, None, :]  # [b, 1, 1, w]
        x = self.tok(torch.tensor(tokens)) + sinusoids(pos, c.dim)
        for layer, block in enumerate(self._blocks()):
            q, k, v = block.qkv(block.ln1(x)).view(b, 3, c.heads, hd).unbind(1)
            ck, cv = cache.k[layer, :b], cache.v[layer, :b]
            ck[rows, :, ring] = k
            cv[rows, :, ring] = v
            att = F.scaled_dot_product_attention(q[:, :, None], ck, cv, attn_mask=mask)
            x = x + block.proj(att.reshape(b, c.dim))
            x = x + block.mlp(x)
        logits: torch.Tensor = self.head(self.ln(x))
        return logits

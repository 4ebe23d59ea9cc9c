"""A small GPT-style model trained with DDP over gloo on CPU, reporting to Vigil.

    vigil run --job tiny-gpt -- torchrun --standalone --nproc-per-node 2 \\
        examples/train_tiny_gpt.py --steps 200 --ckpt-dir /tmp/tiny-gpt

The Vigil lines are the two-line integration (``init`` is a no-op without an endpoint, so
the script runs the same without Vigil). It checkpoints every ``--ckpt-every`` steps and
resumes from the newest checkpoint, so a restart by ``torchrun --max-restarts`` loses at
most that many steps. Data is synthetic: nothing is downloaded.

A drifting job (issue 14): ``--curriculum 0:64,40:128`` trains at sequence length 64, then
at 128 from step 40, so the op sequence changes mid-training. With ``VIGIL_SWAP=1`` and a
``VIGIL_MEMORY_BUDGET_BYTES`` below the longer length's peak, Vigil sees the drift and sends
an activation-swap policy that the ranks apply (``vigil demo --swap`` tells the story).
``--modelled-peaks`` prints, per length, what one unmodified step needs (parameters,
gradients and optimizer state, plus saved activations at their peak), without training::

    python examples/train_tiny_gpt.py --curriculum 0:64,40:128 --dim 32 --modelled-peaks
"""

from __future__ import annotations

import argparse
import json
import math
import os
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import collector as vigil


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, seq, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[:, : idx.shape[1]]
        for block in self.blocks:
            x = block(x, self.mask[: idx.shape[1], : idx.shape[1]])
        return self.head(self.ln(x))


def curriculum(text: str) -> list[tuple[int, int]]:
    """``"0:64,40:128"`` → ``[(0, 64), (40, 128)]``: (from step, sequence length), by step."""
    try:
        stages = sorted((int(a), int(b)) for a, b in (part.split(":") for part in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected STEP:LENGTH,…, not {text!r}") from None
    if not stages or stages[0][0] != 0 or any(seq < 1 for _, seq in stages):
        raise argparse.ArgumentTypeError("the first stage starts at step 0; lengths are >= 1")
    return stages


def seq_at(args: argparse.Namespace, step: int) -> int:
    """The sequence length of ``step``: the curriculum's stage, else ``--seq``."""
    stages: list[tuple[int, int]] = args.curriculum or [(0, args.seq)]
    return next(seq for start, seq in reversed(stages) if step >= start)


def longest(args: argparse.Namespace) -> int:
    stages: list[tuple[int, int]] = args.curriculum or [(0, args.seq)]
    return max(seq for _, seq in stages)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument(
        "--curriculum",
        type=curriculum,
        default=None,
        help="sequence length by step, STEP:LENGTH,… (e.g. 0:64,40:128); overrides --seq",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: each rank trains on GPU LOCAL_RANK (modulo the count); gloo still "
        "carries the gradients",
    )
    p.add_argument(
        "--modelled-peaks",
        action="store_true",
        help="print each length's modelled peak memory per rank (JSON) and exit",
    )
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--ckpt-dir", type=Path, default=None)
    p.add_argument("--ckpt-every", type=int, default=20)
    p.add_argument(
        "--pg-timeout",
        type=float,
        default=60,
        help="seconds before gloo gives up on a peer (torch's default is 30 min): a group "
        "that cannot form after a restart fails fast, and torchrun tries again",
    )
    p.add_argument(
        "--no-step-marks",
        action="store_true",
        help="don't call vigil.step(): steps then come from the optimizer hook",
    )
    return p.parse_args(argv)


def latest_checkpoint(ckpt_dir: Path | None) -> Path | None:
    if ckpt_dir is None or not ckpt_dir.exists():
        return None
    found = sorted(ckpt_dir.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
    return found[-1] if found else None


def init_group(timeout: timedelta) -> None:
    """``init_process_group("gloo")``, namespaced by torchrun's restart count.

    After a restart, torchrun's rendezvous store can still hold the previous attempt's
    peer addresses under the same keys; gloo would then dial a dead process and fail
    ("connectFullMesh … Connection refused"). A prefix per attempt keeps them apart.
    """
    store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore(f"attempt-{attempt}", store),
        rank=rank,
        world_size=world,
        timeout=timeout,
    )


def train_step(
    net: nn.Module, model: nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor, vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward ``net`` (the model or its DDP wrapper), backward, clip, update; (loss, norm)."""
    logits = net(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss, grad_norm


def modelled_peaks(args: argparse.Namespace) -> dict[int, dict[str, int]]:
    """Per sequence length of the run, one unmodified training step as the swap simulator
    models it: ``base`` (parameters, gradients, optimizer state) and ``peak`` (base plus the
    saved activations at their peak), in bytes per rank. Profiles a fresh model in this
    process (``collector.integrations.profile``, ``detectors.swap.simulate``)."""
    lengths = sorted({seq for _, seq in args.curriculum or [(0, args.seq)]})
    return {seq: _modelled_peak(args, seq) for seq in lengths}


def _modelled_peak(args: argparse.Namespace, seq: int) -> dict[str, int]:
    from collector.integrations.profile import capture_profile
    from detectors.swap import simulate

    torch.manual_seed(0)
    model = TinyGPT(args.vocab, args.dim, args.layers, args.heads, longest(args))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    tokens = torch.randint(0, args.vocab, (args.batch, seq + 1))

    def step() -> None:
        train_step(model, model, opt, tokens, args.vocab)

    step()  # the optimizer's state exists, as in training
    prof = capture_profile(step, module=model, optimizer=opt)
    base = prof["param_bytes"] + prof["grad_bytes"] + prof["optimizer_bytes"]
    peak = simulate(prof, None, bandwidth_bytes_per_s=math.inf).peak_bytes
    return {"base": int(base), "peak": int(peak)}


def pick_device(kind: str) -> torch.device:
    if kind == "cpu":
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    if args.modelled_peaks:
        print(json.dumps(modelled_peaks(args)))
        return
    init_group(timedelta(seconds=args.pg_timeout))
    rank = dist.get_rank()
    vigil.init()  # configured by VIGIL_* (vigil run sets them); a no-op without an endpoint

    torch.manual_seed(0)
    device = pick_device(args.device)
    model = TinyGPT(args.vocab, args.dim, args.layers, args.heads, longest(args)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    start = 0
    ckpt = latest_checkpoint(args.ckpt_dir)
    if ckpt is not None:
        state = torch.load(ckpt, weights_only=True, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
        vigil.event("checkpoint_loaded", step=state["step"], path=str(ckpt))
        if rank == 0:
            print(f"resumed from {ckpt} at step {start}", flush=True)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

    ckpt_lock, rolling_back = threading.Lock(), [False]

    @vigil.on_action("rollback")
    def rollback(params: dict) -> dict:
        """Set aside the checkpoints from the bad step on (they hold NaN weights) and have
        torchrun restart the group, which resumes from the last good one. Every rank does
        it (renames are idempotent), so it holds even if rank 0 is torn down first."""
        before = int(params.get("before_step", step_now[0]))
        moved = []
        with ckpt_lock:  # no save may slip in after this: the weights are poisoned
            rolling_back[0] = True
            for path in args.ckpt_dir.glob("step-*.pt") if args.ckpt_dir else ():
                if int(path.stem.split("-")[1]) >= before:
                    try:
                        os.replace(path, path.with_suffix(".bad"))
                        moved.append(path.name)
                    except FileNotFoundError:
                        pass  # another rank moved it first
        return {"set_aside": sorted(moved), "restart": True}

    @vigil.on_action("checkpoint_now")
    def checkpoint_now(params: dict) -> dict:
        return {"saved": save(step_now[0], force=True)}

    def save(step: int, force: bool = False) -> str | None:
        if args.ckpt_dir is None or rank != 0 or (step % args.ckpt_every and not force):
            return None
        with ckpt_lock:
            return None if rolling_back[0] else _save(step)

    def _save(step: int) -> str:
        args.ckpt_dir.mkdir(parents=True, exist_ok=True)
        path = args.ckpt_dir / f"step-{step}.pt"
        tmp = path.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
        os.replace(tmp, path)
        vigil.event("checkpoint_saved", step=step, path=str(path))
        return str(path)

    gen = torch.Generator().manual_seed(1000 + rank)
    step_now = [start]
    started = time.perf_counter()
    for step in range(start, args.steps):
        step_now[0] = step
        seq = seq_at(args, step)
        tokens = torch.randint(0, args.vocab, (args.batch, seq + 1), generator=gen).to(device)
        marker = vigil.step(step) if not args.no_step_marks else _nullcontext()
        with marker:
            loss, grad_norm = train_step(ddp, model, opt, tokens, args.vocab)
        vigil.log(loss=loss.item(), grad_norm=float(grad_norm), tokens=tokens.numel())
        save(step)
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            value = loss.item()
            print(
                f"step {step} loss {value:.3f}" + (" (NaN!)" if math.isnan(value) else ""),
                flush=True,
            )
    if rank == 0:
        print(
            f"done: {args.steps - start} steps in {time.perf_counter() - started:.1f}s", flush=True
        )
    vigil.shutdown()
    dist.destroy_process_group()


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    main()

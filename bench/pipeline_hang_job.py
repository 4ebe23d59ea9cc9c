"""A pipeline-parallel gloo training job that hangs on purpose (run by ``bench/pipeline_hangs.py``).

Under ``torchrun --nproc-per-node=S*D``: ``S`` pipeline stages × ``D`` data-parallel replicas
(rank = stage * D + replica), a tiny MLP per stage, 4 microbatches per step. Each step moves
activations forward and gradients back between stages, all-reduces the gradients over each
stage's data-parallel group and the loss over the world (for logging, as training loops
do), then takes an optimizer step. The Vigil collector watches it (``VIGIL_ENDPOINT``, …).

How stages talk (``--style``):

- ``1f1b``: ``torch.distributed.pipelining``'s ``Schedule1F1B`` (batched isend/irecv on
  each replica's pipeline group, sends waited on later);
- ``sendrecv``: a hand-written GPipe schedule with blocking ``send``/``recv`` on the world
  group (global ranks);
- ``pairs``: the same schedule over one 2-rank process group per pair of adjacent stages,
  moving tensors with ``broadcast`` (as DeepSpeed's pipeline engine does).

Faults (``--fault KIND:RANK:STEP[:PHASE]``, repeatable) strike in the rank's first forward
(``PHASE`` ``fwd``, default) or backward (``bwd``) of step ``STEP``:

- ``stop``: the rank stops making progress (sleeps forever; its other threads run on);
- ``error``: the rank raises; a non-daemon thread (a checkpoint writer waiting for work)
  keeps the process, and its sockets, alive;
- ``gil``: the rank blocks in a C call that holds the GIL (no Python thread runs again).

With ``--fr-dir``, every rank writes its Flight Recorder dump (``_dump_<rank>``) there when
the file ``TRIGGER`` appears in it (gloo's Flight Recorder records collectives only, and
leaves ``pg_config`` empty: the dumper fills it in from torch's process-group registry).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import pickle
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import collector as vigil

WIDTH = 16
MICROBATCHES = 4
MB_SIZE = 2
COMPUTE_S = 0.01  # per microbatch forward: steps of 0.1-0.2 s, so collectors ship a few batches


@dataclass(frozen=True)
class Fault:
    kind: str  # stop | error | gil
    rank: int
    step: int
    phase: str  # fwd | bwd

    @classmethod
    def parse(cls, text: str) -> Fault:
        kind, rank, step, *phase = text.split(":")
        if kind not in ("stop", "error", "gil") or (phase and phase[0] not in ("fwd", "bwd")):
            raise SystemExit(f"bad --fault {text!r}: KIND:RANK:STEP[:fwd|bwd]")
        return cls(kind, int(rank), int(step), phase[0] if phase else "fwd")


class Injector:
    """Strikes this rank's fault at its first forward/backward of the fault's step."""

    def __init__(self, fault: Fault | None) -> None:
        self.fault, self.step = fault, -1

    def __call__(self, phase: str) -> None:
        f = self.fault
        if f is None or f.step != self.step or f.phase != phase:
            return
        print(f"rank {f.rank}: {f.kind} at step {f.step} ({phase})", flush=True)
        if f.kind == "stop":
            while True:
                time.sleep(3600)
        if f.kind == "gil":
            libc = ctypes.PyDLL(ctypes.util.find_library("c"))  # PyDLL keeps the GIL
            while True:
                libc.sleep(3600)
        raise RuntimeError(f"injected error on rank {f.rank} at step {f.step}")


class Stage(nn.Module):
    def __init__(self, inject: Injector) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
        self.inject = inject

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inject("fwd")
        time.sleep(COMPUTE_S)  # a real stage computes for a while
        y: torch.Tensor = self.net(x)
        if y.requires_grad:
            y.register_hook(self._backward)  # type: ignore[no-untyped-call]
        return y

    def _backward(self, grad: torch.Tensor) -> None:
        self.inject("bwd")


@dataclass
class Topology:
    rank: int
    stages: int
    dp: int

    @property
    def stage(self) -> int:
        return self.rank // self.dp

    @property
    def replica(self) -> int:
        return self.rank % self.dp

    def at(self, stage: int) -> int:
        return stage * self.dp + self.replica


def make_groups(topo: Topology) -> dict[str, Any]:
    """Every rank creates every group, in the same order (torch requires it)."""
    groups: dict[str, Any] = {"pp": None, "dp": None, "pairs": {}}
    for d in range(topo.dp):
        g = dist.new_group([s * topo.dp + d for s in range(topo.stages)], group_desc="pp")
        if d == topo.replica:
            groups["pp"] = g
    for s in range(topo.stages):
        g = dist.new_group([s * topo.dp + d for d in range(topo.dp)], group_desc="dp")
        if s == topo.stage:
            groups["dp"] = g
    for s in range(topo.stages - 1):
        for d in range(topo.dp):
            pair = [s * topo.dp + d, (s + 1) * topo.dp + d]
            g = dist.new_group(pair, group_desc="pp_pair")
            if topo.rank in pair:
                groups["pairs"][s] = g  # the pair (s, s + 1) of this replica
    return groups


class Link:
    """Moves one tensor between adjacent stages, by ``style``."""

    def __init__(self, style: str, topo: Topology, groups: dict[str, Any]) -> None:
        self.style, self.topo, self.groups = style, topo, groups

    def send(self, t: torch.Tensor, to_stage: int) -> None:
        if self.style == "sendrecv":
            dist.send(t.contiguous(), dst=self.topo.at(to_stage))
        else:
            pair = self.groups["pairs"][min(self.topo.stage, to_stage)]
            dist.broadcast(t.contiguous(), src=self.topo.rank, group=pair)

    def recv(self, from_stage: int) -> torch.Tensor:
        buf = torch.zeros(MB_SIZE, WIDTH)
        if self.style == "sendrecv":
            dist.recv(buf, src=self.topo.at(from_stage))
        else:
            pair = self.groups["pairs"][min(self.topo.stage, from_stage)]
            dist.broadcast(buf, src=self.topo.at(from_stage), group=pair)
        return buf


def gpipe_step(
    model: Stage, link: Link, topo: Topology, xs: list[torch.Tensor], ys: list[torch.Tensor]
) -> torch.Tensor:
    """All forwards, then all backwards; returns this stage's summed loss (0 but last)."""
    first, last = topo.stage == 0, topo.stage == topo.stages - 1
    inputs, outputs, loss = [], [], torch.zeros(())
    for m in range(MICROBATCHES):
        x = xs[m] if first else link.recv(topo.stage - 1).requires_grad_()
        y = model(x)
        inputs.append(x)
        outputs.append(y)
        if not last:
            link.send(y.detach(), topo.stage + 1)
    for m in reversed(range(MICROBATCHES)):
        if last:
            mb_loss = nn.functional.mse_loss(outputs[m], ys[m])
            mb_loss.backward()  # type: ignore[no-untyped-call]
            loss = loss + mb_loss.detach()
        else:
            outputs[m].backward(link.recv(topo.stage + 1))
        if not first:
            link.send(inputs[m].grad, topo.stage - 1)  # type: ignore[arg-type]
    return loss


def pipelining_schedule(model: Stage, topo: Topology, groups: dict[str, Any]) -> Any:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    stage = PipelineStage(model, topo.stage, topo.stages, torch.device("cpu"), group=groups["pp"])
    return Schedule1F1B(stage, MICROBATCHES, loss_fn=nn.functional.mse_loss, scale_grads=False)


def average_gradients(model: nn.Module, dp_group: Any, dp: int) -> None:
    """One all-reduce of the stage's flattened gradients over its data-parallel group."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=dp_group)
    flat /= dp
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def pg_config() -> dict[str, dict[str, str]]:
    """This rank's process groups as NCCL's dumps list them: name -> name, desc, ranks (a
    string, "[0, 8]"). Gloo's Flight Recorder (torch 2.13) writes an empty ``pg_config``."""
    import torch.distributed.distributed_c10d as c10d

    out: dict[str, dict[str, str]] = {}
    for pg, name in c10d._world.pg_names.items():
        ranks = dist.get_process_group_ranks(pg)
        desc = getattr(pg, "group_desc", "") or ""
        out[str(name)] = {"name": str(name), "desc": desc, "ranks": json.dumps(sorted(ranks))}
    return out


def fr_dumper(out: Path, rank: int) -> None:
    """Write this rank's Flight Recorder dump once ``out/TRIGGER`` appears: torch's own dump,
    with ``pg_config`` filled in (see :func:`pg_config`)."""
    import torch._C._distributed_c10d as c10d

    def watch() -> None:
        while not (out / "TRIGGER").exists():
            time.sleep(0.2)
        raw = getattr(c10d, "_dump_fr_trace")(True, False, False)  # noqa: B009 (private)
        dump = pickle.loads(raw)  # this process's own dump
        dump["pg_config"] = pg_config()
        tmp = out / f"._dump_{rank}"
        tmp.write_bytes(pickle.dumps(dump))
        tmp.rename(out / f"_dump_{rank}")

    threading.Thread(target=watch, daemon=True, name="fr-dumper").start()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--style", choices=("1f1b", "sendrecv", "pairs"), required=True)
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--fault", action="append", default=[], type=Fault.parse)
    ap.add_argument("--fr-dir", type=Path)
    args = ap.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    topo = Topology(rank, world // args.dp, args.dp)
    dist.init_process_group("gloo")
    vigil.init()
    if args.fr_dir is not None:
        fr_dumper(args.fr_dir, rank)
    # A checkpoint writer thread, as real jobs have: not a daemon, so an uncaught error in
    # the training loop leaves the process (and its sockets) up, waiting for it.
    writer: queue.Queue[Any] = queue.Queue()
    threading.Thread(target=writer.get, name="checkpoint-writer").start()

    torch.manual_seed(0)
    inject = Injector(next((f for f in args.fault if f.rank == rank), None))
    model = Stage(inject)
    torch.manual_seed(1000 + topo.stage)  # replicas of a stage start equal
    first = model.net[0]
    assert isinstance(first, nn.Linear)
    first.reset_parameters()
    groups = make_groups(topo)
    link = Link(args.style, topo, groups)
    schedule = pipelining_schedule(model, topo, groups) if args.style == "1f1b" else None
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(topo.replica)
    for step in range(args.steps):
        inject.step = step
        with vigil.step(step):
            xs = [torch.randn(MB_SIZE, WIDTH, generator=gen) for _ in range(MICROBATCHES)]
            ys = [torch.tanh(x.flip(1)) for x in xs]
            opt.zero_grad()
            if schedule is not None:
                losses: list[torch.Tensor] = []
                if topo.stage == 0:
                    schedule.step(torch.cat(xs))
                elif topo.stage == topo.stages - 1:
                    schedule.step(target=torch.cat(ys), losses=losses)
                else:
                    schedule.step()
                loss = torch.stack(losses).sum() if losses else torch.zeros(())
            else:
                loss = gpipe_step(model, link, topo, xs, ys)
            average_gradients(model, groups["dp"], args.dp)
            dist.all_reduce(loss)  # the logged loss, over the world: every rank takes part
            opt.step()
            vigil.log(loss=loss.item())
    writer.put(None)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

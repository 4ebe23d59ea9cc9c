"""Naming a trace's collectives: op, process group, members and bytes, from what a Kineto
trace says about them, best source first.

1. An NCCL kernel's own arguments (PyTorch 2.x): ``Collective name``, ``Process Group
   Name``/``Description``/``Ranks``, ``In msg nelems``/``Out msg nelems`` and ``dtype``.
2. The CPU call around its launch: a ``nccl:<op>`` annotation (its ``Input Dims`` and
   ``Input type`` give the bytes) or ``record_param_comms`` with the arguments above.
3. The kernel's name: ``ncclKernel_AllReduce_RING_LL_Sum_float`` → ``all_reduce``.

Groups are labelled as the collector labels them (``collector/integrations/
torch_distributed.py``): ``"world"`` for the default group, else the group's name prefixed
by its description; a trace with a single process group is all ``"world"``; without any
group name, a kernel's CUDA stream stands for its communicator (``"stream 84"``).

CPU backends (gloo, MPI, UCC) run the collective on a CPU thread under their annotation
(``gloo:all_reduce``), so in a trace without GPU events those annotations are the
collectives. ``nccl:`` annotations only enqueue kernels: never timed as collectives.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

MAX_OP = 64
MAX_GROUP = 128
_CPU_CALL = re.compile(r"^(nccl|gloo|mpi|ucc|xccl):(\w+)$")
CPU_BACKENDS = frozenset({"gloo", "mpi", "ucc"})
_KERNEL_OP = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
# c10d's names (kernel arguments, annotations) → the collector's op names.
_OPS = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "_allgather_base": "all_gather_into_tensor",
    "_all_gather_base": "all_gather_into_tensor",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all_single",
    "sendrecv": "send_recv",
}
# Bytes per element by the type names of kernel arguments (c10 ``ScalarType``) and of
# annotations' ``Input type`` (C++ names), lower case, ``c10::`` dropped.
_SIZES = {
    **dict.fromkeys(("float", "float32", "int", "int32", "unsigned int", "uint32"), 4),
    **dict.fromkeys(("double", "float64", "long", "long int", "int64", "long long"), 8),
    **dict.fromkeys(("half", "float16", "bfloat16", "short", "short int", "int16"), 2),
    **dict.fromkeys(("char", "signed char", "int8", "byte", "unsigned char", "uint8"), 1),
    **dict.fromkeys(("bool", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz"), 1),
    "complexfloat": 8,
    "complexdouble": 16,
}


@dataclass(frozen=True)
class CommCall:
    """What is known of one collective call or kernel; ``None``: not said here."""

    op: str | None = None
    pg_name: str | None = None
    pg_desc: str | None = None
    members: tuple[int, ...] | None = None
    bytes: int | None = None
    backend: str | None = None  # of a CPU annotation: "nccl", "gloo", …
    stream: int | None = None

    def named_by(self, cpu: CommCall | None, *, stream: int) -> CommCall:
        """This kernel's call, its gaps filled from the CPU call around its launch."""
        filled = self
        if cpu is not None:
            filled = replace(
                self,
                op=self.op_from_args or cpu.op or self.op,
                pg_name=self.pg_name or cpu.pg_name,
                pg_desc=self.pg_desc or cpu.pg_desc,
                members=self.members or cpu.members,
                bytes=self.bytes if self.bytes is not None else cpu.bytes,
            )
        return replace(filled, stream=stream)

    @property
    def op_from_args(self) -> str | None:
        return self.op if self.backend == "args" else None


def _op(name: str) -> str:
    name = name.strip()
    return (_OPS.get(name.lower()) or name.lstrip("_") or "unknown")[:MAX_OP]


def _size(dtype: Any) -> int:
    key = str(dtype).lower().replace("c10::", "").strip()
    return _SIZES.get(key, 0)


def _nelems(dims: Any) -> int:
    if not isinstance(dims, list) or not all(isinstance(d, int) for d in dims):
        return 0
    return math.prod(dims) if dims else 0


def _members(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list) and value and all(isinstance(r, int) and r >= 0 for r in value):
        return tuple(value)
    return None


def _from_args(args: dict[str, Any]) -> CommCall | None:
    """The arguments PyTorch 2.x puts on NCCL kernels and ``record_param_comms``."""
    name = args.get("Collective name")
    if not isinstance(name, str) or not name:
        return None
    nelems = [args.get(k) for k in ("In msg nelems", "Out msg nelems")]
    counts = [n for n in nelems if isinstance(n, int) and n >= 0]
    size = _size(args.get("dtype"))
    pg_name, pg_desc = args.get("Process Group Name"), args.get("Process Group Description")
    return CommCall(
        op=_op(name),
        pg_name=str(pg_name) if pg_name not in (None, "") else None,
        pg_desc=str(pg_desc) if pg_desc not in (None, "", "undefined") else None,
        members=_members(args.get("Process Group Ranks")),
        bytes=max(counts) * size if counts and size else None,
        backend="args",
    )


def kernel_call(name: str, args: dict[str, Any]) -> CommCall:
    """An NCCL kernel's collective call: its arguments, else its name."""
    if (found := _from_args(args)) is not None:
        return found
    m = _KERNEL_OP.match(name)
    return CommCall(op=_op(_CAMEL.sub("_", m.group(1)).lower() if m else "unknown"))


def cpu_call(name: str, args: dict[str, Any]) -> CommCall | None:
    """A CPU event's collective call (``nccl:all_reduce``, ``record_param_comms``, …);
    ``None`` for an event that is none."""
    if (found := _from_args(args)) is not None:
        return found
    m = _CPU_CALL.match(name)
    if m is None:
        return None
    dims, types = args.get("Input Dims"), args.get("Input type")
    size = 0
    if isinstance(dims, list) and isinstance(types, list):
        size = sum(_nelems(d) * _size(t) for d, t in zip(dims, types, strict=False))
    return CommCall(op=_op(m.group(2)), bytes=size, backend=m.group(1))


@dataclass(frozen=True)
class Collective:
    step: int
    group: str
    op: str
    duration_s: float
    count: int
    bytes: int
    members: list[int] | None


class CommNames:
    """Group labels and members for one trace (its ``distributedInfo.pg_config``)."""

    def __init__(self, meta: dict[str, Any]) -> None:
        info = meta.get("distributedInfo")
        pgs = info.get("pg_config") if isinstance(info, dict) else None
        self.pgs = [pg for pg in pgs if isinstance(pg, dict)] if isinstance(pgs, list) else []
        count = info.get("pg_count") if isinstance(info, dict) else None
        self.single = len(self.pgs) == 1 or count == 1

    def group(self, call: CommCall) -> tuple[str, list[int] | None]:
        name, desc = call.pg_name, call.pg_desc
        members = list(call.members) if call.members else None
        if name is None and desc is None:
            if self.single:
                return "world", None
            if call.stream is not None:
                return f"stream {call.stream}", None
            return (call.backend or "unknown"), None
        if desc == "default_pg" or (desc is None and name == "0"):
            return "world", None
        if members is None:
            pg = next((pg for pg in self.pgs if str(pg.get("pg_name")) == name), None)
            found = _members(pg.get("ranks")) if pg is not None else None
            members = list(found) if found else None
        label = f"{desc}/{name}" if desc and name else (name or desc or "unknown")
        return label[:MAX_GROUP], members

    def collectives(
        self, step: int, calls: Iterable[tuple[CommCall, float, float, int | None]]
    ) -> list[Collective]:
        """One record per (group, op) of an iteration's communication: its kernels' (or
        CPU calls') time, the calls (one CPU call may launch several kernels) and bytes."""
        acc: dict[tuple[str, str], list[Any]] = {}
        for n, (call, start, end, cpu_index) in enumerate(calls):
            label, members = self.group(call)
            key = (label, call.op or "unknown")
            entry = acc.setdefault(key, [0.0, {}, members])
            entry[0] += end - start
            entry[1].setdefault(("cpu", cpu_index) if cpu_index is not None else ("k", n), call)
        return [
            Collective(
                step=step,
                group=group,
                op=op,
                duration_s=duration / 1e6,
                count=len(seen),
                bytes=sum(c.bytes or 0 for c in seen.values()),
                members=members,
            )
            for (group, op), (duration, seen, members) in acc.items()
        ]

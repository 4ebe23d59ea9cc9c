"""The drifting job of ``vigil demo --swap`` and of its end-to-end test, and what Vigil made
of it, read back over REST.

    sc = DriftScenario()
    budget = memory_budget(sc)                    # below the longer length's modelled peak
    proc = launch(base=url, token=ingest, job="drift", scenario=sc, budget=budget, log=f)
    seen = observe(api, "drift")                  # incident, action, policy, ranks' results

The job is ``examples/train_tiny_gpt.py`` on ``ranks`` processes over gloo (CPU) under
``vigil run -- torchrun``, with a sequence-length curriculum (``short``, then ``long`` from
step ``change_at``), so its op sequence changes mid-training. Its ranks run the swap executor
(``VIGIL_SWAP=1``) and report ``VIGIL_MEMORY_BUDGET_BYTES`` as their capacity: the base
(parameters, gradients, optimizer state) plus ``budget_frac`` of the saved activations of
one unmodified step at the longer length, as the swap simulator models it, so that step does
not fit and the shorter one does. On CUDA (item 8 of issue 14) the same job trains on the
GPU (``device="cuda"``: the example's ``--device``) with the same budget; there the steps'
``mem_bytes`` is the allocator's peak (more than the model: workspaces, temporaries), which
may press on the budget at the shorter length already.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import IO, Any

import httpx

from detectors.memory import MemoryConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_tiny_gpt.py"


@dataclass(frozen=True)
class DriftScenario:
    """The job: lengths, when they change, the model, the budget's share of activations."""

    steps: int = 400
    change_at: int = 40
    short: int = 64
    long: int = 128
    ranks: int = 2
    model: tuple[str, ...] = ("--dim", "32", "--layers", "1", "--batch", "4")
    budget_frac: float = 0.7
    device: str = "cpu"

    def example_args(self) -> list[str]:
        """The example's arguments (for torchrun, and for modelling the same job here)."""
        stages = f"0:{self.short},{self.change_at}:{self.long}"
        return ["--steps", str(self.steps), "--curriculum", stages, *self.model]


@cache
def _example() -> ModuleType:
    """The example script as a module (it is a script, not part of the installed package)."""
    spec = importlib.util.spec_from_file_location("vigil_example_train_tiny_gpt", EXAMPLE)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {EXAMPLE}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def modelled_peaks(sc: DriftScenario) -> dict[int, dict[str, int]]:
    """Per length: ``base`` and ``peak`` bytes of one unmodified step (the example's
    ``modelled_peaks``, profiled in this process)."""
    example = _example()
    peaks: dict[int, dict[str, int]] = example.modelled_peaks(example.parse_args(sc.example_args()))
    return peaks


def memory_budget(sc: DriftScenario, peaks: dict[int, dict[str, int]] | None = None) -> int:
    """``VIGIL_MEMORY_BUDGET_BYTES`` for the job: the longer step's base plus ``budget_frac``
    of its activations. A ValueError when the shorter step would not fit either (Vigil would
    then see memory pressure before any drift, and the story would be another one)."""
    peaks = peaks or modelled_peaks(sc)
    long = peaks[sc.long]
    budget = int(long["base"] + sc.budget_frac * (long["peak"] - long["base"]))
    if peaks[sc.short]["peak"] >= MemoryConfig().usage_frac * budget or budget >= long["peak"]:
        raise ValueError(f"budget {budget} B does not lie between the lengths' peaks {peaks}")
    return budget


def launch(
    *, base: str, token: str, job: str, scenario: DriftScenario, budget: int, log: IO[Any]
) -> subprocess.Popen[Any]:
    """Start the job under ``vigil run -- torchrun`` (its own session: ``kill_tree`` it)."""
    sc = scenario
    command = [
        *(sys.executable, "-m", "backend", "run", "--job", job, "--endpoint", base),
        *("--token", token, "--"),
        *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
        *("--nproc-per-node", str(sc.ranks), str(EXAMPLE), *sc.example_args()),
        *(("--device", sc.device) if sc.device != "cpu" else ()),
    ]
    env = {
        **os.environ,
        "VIGIL_SWAP": "1",
        "VIGIL_MEMORY_BUDGET_BYTES": str(budget),
        "VIGIL_HEARTBEAT_S": "0.25",
        "VIGIL_FLUSH_S": "0.25",
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.Popen(
        command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


@dataclass
class Seen:
    """What Vigil made of the job so far (``observe``)."""

    incident: dict[str, Any] | None = None  # the first opseq_change incident
    action: dict[str, Any] | None = None  # the first apply_swap_policy action
    policy: dict[str, Any] | None = None  # its policy's row in GET …/swap
    results: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank → its result
    incidents: list[dict[str, Any]] = field(default_factory=list)

    @property
    def version(self) -> int | None:
        policy = (self.action or {}).get("params", {}).get("policy") or {}
        version = policy.get("version")
        return int(version) if isinstance(version, int) else None

    @property
    def offloaded(self) -> int:
        policy = (self.action or {}).get("params", {}).get("policy") or {}
        return len(policy.get("offload") or [])

    @property
    def storages(self) -> int:
        policy = (self.action or {}).get("params", {}).get("policy") or {}
        return len(policy.get("storage_bytes") or [])

    def applied(self, ranks: int) -> bool:
        """Every rank ran it (its action result) and the job's steps report it (…/swap)."""
        return (
            len(self.results) == ranks
            and all(r.get("applied") is True for r in self.results.values())
            and self.policy is not None
            and self.policy["applied_step"] is not None
            and self.policy["measured_peak_bytes"] is not None
        )


def observe(api: httpx.Client, job: str) -> Seen:
    """One look at the job over REST (``api``: base ``…/api/v1``, a read token)."""
    seen = Seen()
    reply = api.get(f"/jobs/{job}/incidents")
    if reply.status_code == 404:
        return seen  # the job has not reported yet
    reply.raise_for_status()
    seen.incidents = reply.json()
    drift = sorted((i for i in seen.incidents if i["kind"] == "opseq_change"), key=_id)
    seen.incident = drift[0] if drift else None
    actions = api.get(f"/jobs/{job}/actions").raise_for_status().json()
    swaps = sorted((a for a in actions if a["kind"] == "apply_swap_policy"), key=_id)
    # The one for the new shape (for the drift or for the memory pressure it brought; on
    # CUDA the allocator's peak may have asked for one for the old shape before).
    shape = ((seen.incident or {}).get("evidence") or {}).get("to_shape_fp")
    for_drift = [a for a in swaps if shape and a["params"].get("shape_fp") == shape]
    seen.action = (for_drift or swaps or [None])[0]
    if seen.action is None:
        return seen
    for rank, result in (seen.action.get("result") or {}).items():
        if isinstance(result, dict):
            seen.results[int(rank)] = result
    swap = api.get(f"/jobs/{job}/swap").raise_for_status().json()
    rows = [p for p in swap["policies"] if p["version"] == seen.version]
    seen.policy = rows[0] if rows else None
    return seen


def _id(row: dict[str, Any]) -> int:
    return int(row["id"])

"""What a load run is asked to do (``python -m bench.loadgen --help`` says it for people);
checked when made, so a bad value stops the run before any traffic."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from bench.loadgen.faults import Fault, check_faults
from bench.loadgen.job import Shape


@dataclass
class Options:
    endpoints: list[str]
    token: str
    ranks: int
    duration_s: float
    read_token: str | None = None  # for incidents and job reads; default: ``token``
    jobs: int = 1
    step_s: float = 1.0
    tp: int = 1
    ranks_per_node: int = 8
    relay: bool = False  # ship through one relay per node (``bench.loadgen.node``)
    flush_s: float = 1.0
    faults: list[Fault] = field(default_factory=list)
    job_prefix: str = ""
    max_batch: int = 5000
    max_queue: int = 20_000
    timeout_s: float = 5.0
    connections: int = 512  # per endpoint
    report_s: float = 60.0
    poll_s: float = 1.0
    settle_s: float = 60.0
    warmup_s: float = 5.0  # heartbeats only (the ranks initialising) before the first step
    drain_s: float = 30.0
    goodbye: bool = True
    database_url: str | None = None
    cpu: dict[str, str] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ValueError("give at least one endpoint")
        for e in self.endpoints:
            if urlsplit(e).scheme != "http" or not urlsplit(e).hostname:
                raise ValueError(
                    f"endpoint {e!r}: the load generator speaks plain http://host:port"
                )
        if self.warmup_s < 0 or self.settle_s < 0:
            raise ValueError("warm-up and settle times must not be negative")
        if self.jobs < 1 or self.duration_s <= 0 or self.flush_s <= 0:
            raise ValueError("jobs, duration and flush interval must be positive")
        if not self.job_prefix:
            self.job_prefix = "loadgen-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        check_faults(self.faults, ranks=self.ranks, jobs=self.jobs)
        if self.ranks_per_node < 1:
            raise ValueError("ranks per node must be positive")
        # refuses a bad shape now
        Shape(ranks=self.ranks, tp=self.tp, step_s=self.step_s, ranks_per_node=self.ranks_per_node)

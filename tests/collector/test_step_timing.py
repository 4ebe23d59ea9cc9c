"""Step records from a real (single-process) torch loop: data wait, optimizer-hook steps."""

from __future__ import annotations

import time

import httpx
import pytest

import collector as vigil
from tests.conftest import ADMIN
from tests.servers import live_server

torch = pytest.importorskip("torch")
JOB = "timing"


class SlowDataset(torch.utils.data.Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        time.sleep(0.002)
        return torch.randn(4), torch.randn(1)


def steps(base: str) -> list[dict]:
    return httpx.get(f"{base}/api/v1/jobs/{JOB}/steps", headers=ADMIN).json()["items"]


def train(loader, marks: bool) -> None:  # type: ignore[no-untyped-def]
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for n, (x, y) in enumerate(loader):
        ctx = vigil.step(n) if marks else None
        if ctx is not None:
            ctx.__enter__()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if ctx is not None:
            ctx.__exit__(None, None, None)
        vigil.log(loss=loss, tokens=x.numel())  # a 0-d tensor is read with .item()


def test_dataloader_wait_is_counted_as_data_s(sqlite_url):
    loader = torch.utils.data.DataLoader(SlowDataset(), batch_size=8)  # 8 x 2 ms per batch
    with live_server(sqlite_url) as base:
        vigil.init(job=JOB, endpoint=base, token="vigil-dev-ingest")
        train(loader, marks=True)
        assert vigil.flush(timeout=10)
        got = steps(base)
    assert [s["step"] for s in got] == list(range(8))
    assert all(s["data_s"] >= 0.015 for s in got), [s["data_s"] for s in got]
    assert all(s["tokens"] == 32 and s["loss"] > 0 for s in got)


def test_unmarked_loop_gets_steps_from_optimizer_hooks(sqlite_url):
    loader = torch.utils.data.DataLoader(SlowDataset(), batch_size=8)
    with live_server(sqlite_url) as base:
        vigil.init(job=JOB, endpoint=base, token="vigil-dev-ingest")
        train(loader, marks=False)
        vigil.shutdown(timeout=10)  # closes the step in progress
        got = steps(base)
    # The first optimizer.step() starts step 0; each later one closes a step.
    assert [s["step"] for s in got] == list(range(8))
    assert all(s["duration_s"] > 0 and s["mem_bytes"] > 0 for s in got)

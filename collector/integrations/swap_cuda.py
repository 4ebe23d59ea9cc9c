"""CUDA copies for the swap executor (``collector.integrations.swap``): pinned host
buffers, one side stream for both directions (so a copy back is queued after the copy out),
events to order the compute stream after them, ``record_stream`` so that the caching
allocator never hands a block to other work before the copy that reads or writes it ends.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CudaCopies"]


class CudaCopies:
    """CUDA: pinned host buffers, one side stream for copies, events to order them."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.side = torch.cuda.Stream()

    def copy(self, host: Any, src: Any, g: Any, *, out: bool) -> None:
        cuda = self.torch.cuda
        current = cuda.current_stream(src.device)
        self.side.wait_stream(current)  # the data is written by work queued before
        with cuda.stream(self.side):
            host.copy_(src, non_blocking=True)
            src.record_stream(self.side)  # the block is not reused before the copy ends
            g.out_event = cuda.Event()
            g.out_event.record(self.side)

    def fetch(self, g: Any) -> Any:
        torch = self.torch
        with torch.cuda.stream(self.side):
            dev = torch.empty(g.nbytes, dtype=torch.uint8, device=g.device)
            dev.copy_(g.host, non_blocking=True)  # queued after the copy out, same stream
            g.in_event = torch.cuda.Event()
            g.in_event.record(self.side)
        return dev

    def wait(self, event: Any, dev: Any) -> None:
        current = self.torch.cuda.current_stream(dev.device)
        current.wait_event(event)
        dev.record_stream(current)

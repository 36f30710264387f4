"""One host-to-device copy per step: a step's small inputs packed into one int32 buffer.

The host side is pinned on CUDA, so the copy is asynchronous; the device side is where
the step's kernels read them (as views). Float inputs (sampling parameters) travel as
their int32 bit patterns and are viewed back on the device.

NOTE: with the copy asynchronous, the host must not rewrite a buffer the GPU has not
read yet. Two host buffers alternate and each waits for its last copy's event before it
is written again (in practice long done: a step later). The copies and their events go on
the engine's stream (`stream`): an event recorded on another stream (say, the calling
thread's default stream of device 0) would say nothing about this copy. On CPU there is one buffer and
"the device" is the host buffer itself: no copy (unless `separate`, which keeps a second
buffer and copies, as on CUDA: tests run the CUDA path's logic that way).
"""

from __future__ import annotations

import numpy as np
import torch


class Staging:
    def __init__(self, numel: int, device: torch.device, separate: bool = False,
                 stream: torch.cuda.Stream | None = None):
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = stream if stream is not None or not self.cuda else \
            torch.cuda.current_stream(device)
        self.separate = separate or self.cuda
        self._k = 0
        self._alloc(numel)

    def _alloc(self, numel: int) -> None:
        self.numel = numel
        n_host = 2 if self.cuda else 1
        self._hosts = [torch.zeros(numel, dtype=torch.int32, pin_memory=self.cuda) for _ in range(n_host)]
        self._host_arrays = [h.numpy() for h in self._hosts]  # views of the same memory
        self._events: list = [None] * n_host
        self.dev = (torch.zeros(numel, dtype=torch.int32, device=self.device) if self.separate
                    else self._hosts[0])

    def host(self, numel: int) -> np.ndarray:
        """The host buffer to fill for the next step (at least `numel` elements)."""
        if numel > self.numel:
            if self.cuda:
                self.stream.synchronize()  # the old buffers may be in flight
            self._alloc(max(numel, 2 * self.numel))
        if self.cuda:
            self._k ^= 1
            ev = self._events[self._k]
            if ev is not None:
                ev.synchronize()
        return self._host_arrays[self._k]

    def send(self, numel: int) -> torch.Tensor:
        """Copy the first `numel` elements to the device; returns the device buffer."""
        if self.separate and numel:
            self.dev[:numel].copy_(self._hosts[self._k][:numel], non_blocking=self.cuda)
        if self.cuda:
            ev = self._events[self._k] or torch.cuda.Event()
            ev.record(self.stream)
            self._events[self._k] = ev
        return self.dev

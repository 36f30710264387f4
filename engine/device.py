"""The engine's device and stream: every piece of its device work runs inside `DeviceScope`.

CUDA's current device is per host thread, and so is torch's current stream. A worker on
`cuda:1` builds its engine on one thread and steps it on another (consumers/engine_loop.py),
so nothing may rely on "the current device" of whichever thread happens to call: Triton
launches its kernels, and torch allocates and records events, on the *current* device.

    scope = DeviceScope(resolve_device("cuda:1"))
    with scope:            # cuda:1 is current, scope.stream is the current stream
        ...                # loading, profiling, capture, every step

NOTE: all of the engine's device work is queued on `scope.stream`, its own stream, and its
events are recorded there: the host's waits (sampled ids, a pinned staging buffer to be
reused) then wait for exactly that work, whatever stream the calling thread has current.
On CPU the scope does nothing.
"""

from __future__ import annotations

import torch

from inflight.engine.errors import ConfigError


def resolve_device(spec: str | torch.device) -> torch.device:
    """`spec` as a device with an explicit index on CUDA ("cuda" is the current device, at
    start-up device 0): the same code path for `cuda`, `cuda:0` and `cuda:1`."""
    try:
        dev = torch.device(spec)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"EngineConfig.device={spec!r} is not a device: use cpu, cuda or "
                          f"cuda:N ({exc})") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise ConfigError(f"EngineConfig.device={spec!r}: the engine runs on cpu or cuda[:N]")
    if not torch.cuda.is_available():
        raise ConfigError(f"EngineConfig.device={spec!r} but no CUDA device is visible to this "
                          "process (CUDA_VISIBLE_DEVICES, the container's GPU request): run with "
                          "device=cpu or give the process a GPU")
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if not 0 <= index < count:
        raise ConfigError(f"EngineConfig.device={spec!r} but this process sees {count} CUDA "
                          f"device(s), cuda:0..cuda:{count - 1} (indices count within "
                          "CUDA_VISIBLE_DEVICES): pick one of them, or cuda:auto in the worker")
    return torch.device("cuda", index)


class DeviceScope:
    """Enter around engine work: the engine's device is current and its stream is the
    current stream for the duration (on the calling thread, whichever it is)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream: torch.cuda.Stream | None = None
        self._stack: list = []
        if self.cuda:
            with torch.cuda.device(device):
                self.stream = torch.cuda.Stream(device)

    def bind_thread(self) -> None:
        """Make the engine's device this thread's current device for good (the engine
        thread calls it once; a thread that only steps the engine needs nothing more)."""
        if self.cuda:
            torch.cuda.set_device(self.device)

    def synchronize(self) -> None:
        if self.cuda:
            self.stream.synchronize()

    def __enter__(self) -> "DeviceScope":
        if self.cuda:
            dev, stream = torch.cuda.device(self.device), torch.cuda.stream(self.stream)
            dev.__enter__()
            stream.__enter__()
            self._stack.append((dev, stream))
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            dev, stream = self._stack.pop()
            stream.__exit__(*exc)
            dev.__exit__(*exc)

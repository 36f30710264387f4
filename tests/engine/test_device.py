"""Device strings resolve to one explicit device (engine/device.py), or a ConfigError that
says what to pick; the engine's device scope is a no-op on CPU. CUDA itself: tests/engine/test_cuda.py."""

from __future__ import annotations

import pytest
import torch

from inflight.engine.device import DeviceScope, resolve_device
from inflight.engine.errors import ConfigError


def test_cpu():
    assert resolve_device("cpu") == torch.device("cpu")
    scope = DeviceScope(torch.device("cpu"))
    with scope as s:
        assert s is scope and scope.stream is None
    scope.bind_thread()
    scope.synchronize()


@pytest.mark.parametrize("spec,match", [
    ("cuda:auto", "not a device"),     # the worker resolves cuda:auto before the engine sees it
    ("gpu", "not a device"),
    ("meta", "runs on cpu or cuda"),
])
def test_bad_strings(spec, match):
    with pytest.raises(ConfigError, match=match):
        resolve_device(spec)


def test_cuda_without_a_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="no CUDA device is visible"):
        resolve_device("cuda:0")


def test_cuda_indices(monkeypatch):
    """`cuda` is the current device, made explicit; an index past the visible devices names
    the range (the same path for cuda:0 and cuda:1)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match=r"sees 2 CUDA device\(s\), cuda:0..cuda:1"):
        resolve_device("cuda:2")


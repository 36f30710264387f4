"""Which adapters are registered, kept in host memory, and resident in a slot.

    registered (name -> folder)   every adapter a request may name (`add`, `remove`)
      host      (LRU, max_cpu_loras)  read and checked adapters; others are re-read on need
        resident (max_loras slots)    in the slot tensors the forward reads (engine/lora/slots.py)

The scheduler asks `acquire(req)` before admitting a request that names an adapter: a
resident adapter just gains a user; one that is not takes a free slot or evicts the least
recently used idle one (no running request uses it). NOTE: an adapter with users is never
evicted, so a slot's weights never change under a request that runs on them; with every
slot busy the request waits (other requests are admitted past it). `release(req)` when it
stops running (finished, aborted, preempted).
"""

from __future__ import annotations

import logging
import pathlib
import time
from collections import OrderedDict

from inflight.engine.lora.adapter import LoraAdapter, LoraError, load_adapter
from inflight.engine.lora.slots import LoraSlots
from inflight.engine.model_config import ModelConfig

log = logging.getLogger(__name__)


class LoraManager:
    def __init__(self, cfg: ModelConfig, slots: LoraSlots, max_cpu_loras: int):
        self.cfg, self.slots = cfg, slots
        self.max_cpu_loras = max_cpu_loras
        self.paths: dict[str, pathlib.Path] = {}
        self.digests: dict[str, str] = {}
        self.host: OrderedDict[str, LoraAdapter] = OrderedDict()
        self.slot_of: dict[str, int] = {}
        self.name_in: list[str | None] = [None] * slots.num_slots
        self.users = [0] * slots.num_slots
        self.idle: OrderedDict[int, None] = OrderedDict()  # resident, no users: LRU first
        self.num_loads = self.num_evictions = 0
        self.load_seconds: list[float] = []  # slot loads since the last `take_load_seconds`

    # -- registration ------------------------------------------------------------------
    def add(self, name: str, path: str | pathlib.Path) -> LoraAdapter:
        """Register `name` -> the PEFT folder `path`, read and checked now (LoraError)."""
        if not name or not isinstance(name, str):
            raise LoraError(f"adapter name {name!r}: give a non-empty name")
        if name in self.paths:
            raise LoraError(f"adapter {name!r} is already loaded (from {self.paths[name]}): "
                            "unload it first to load another folder under that name")
        adapter = self._read(name, pathlib.Path(path))
        self.paths[name] = adapter.path
        self.digests[name] = adapter.digest
        self._keep_on_host(adapter)
        return adapter

    def remove(self, name: str, in_use: int = 0) -> None:
        """Unregister `name`. `in_use`: unfinished requests naming it (refused when > 0)."""
        if name not in self.paths:
            raise LoraError(f"adapter {name!r} is not loaded (loaded: {sorted(self.paths)})")
        slot = self.slot_of.get(name)
        if in_use or (slot is not None and self.users[slot]):
            raise LoraError(f"adapter {name!r} has {max(in_use, 1)} unfinished request(s): "
                            "unload it once they finish (or abort them)")
        if slot is not None:
            self._evict(slot, count=False)
        del self.paths[name], self.digests[name]
        self.host.pop(name, None)

    def names(self) -> list[str]:
        return sorted(self.paths)

    def __contains__(self, name: str) -> bool:
        return name in self.paths

    # -- residency -----------------------------------------------------------------------
    def acquire(self, req) -> bool:
        """Give req its adapter's slot (req.lora_slot); False when every slot is busy."""
        slot = self.slot_of.get(req.lora)
        if slot is None:
            slot = self._free_slot()
            if slot is None:
                return False
            self._load(req.lora, slot)
        self.users[slot] += 1
        self.idle.pop(slot, None)
        req.lora_slot = slot
        return True

    def release(self, req) -> None:
        slot = req.lora_slot
        if slot < 0:
            return
        req.lora_slot = -1
        self.users[slot] -= 1
        if self.users[slot] == 0:
            self.idle[slot] = None  # most recently used last

    def _free_slot(self) -> int | None:
        for slot, name in enumerate(self.name_in):
            if name is None:
                return slot
        if not self.idle:
            return None
        slot = next(iter(self.idle))
        self._evict(slot)
        return slot

    def _evict(self, slot: int, count: bool = True) -> None:
        name = self.name_in[slot]
        del self.slot_of[name]
        self.name_in[slot] = None
        self.idle.pop(slot, None)
        self.slots.clear(slot)
        if count:
            self.num_evictions += 1
            log.info("evicted LoRA adapter %r from slot %d", name, slot)

    def _load(self, name: str, slot: int) -> None:
        t0 = time.perf_counter()
        adapter = self.host.get(name)
        if adapter is None:
            adapter = self._read(name, self.paths[name])
            self._keep_on_host(adapter)
        else:
            self.host.move_to_end(name)
        self.slots.load(slot, adapter)
        self.slot_of[name] = slot
        self.name_in[slot] = name
        self.num_loads += 1
        self.load_seconds.append(time.perf_counter() - t0)

    def _read(self, name: str, path: pathlib.Path) -> LoraAdapter:
        return load_adapter(name, path, self.cfg, self.slots.max_rank, self.slots.dtype)

    def _keep_on_host(self, adapter: LoraAdapter) -> None:
        self.host[adapter.name] = adapter
        self.host.move_to_end(adapter.name)
        while len(self.host) > self.max_cpu_loras:
            self.host.popitem(last=False)

    def take_load_seconds(self) -> list[float]:
        out, self.load_seconds = self.load_seconds, []
        return out

    def stats(self) -> dict:
        return {"lora_loaded": len(self.paths), "lora_resident": len(self.slot_of),
                "lora_max": self.slots.num_slots, "lora_loads": self.num_loads,
                "lora_evictions": self.num_evictions,
                # NOTE: drained: each slot load's time is reported by one stats() call
                "lora_load_seconds_new": self.take_load_seconds()}

"""Multi-LoRA serving: PEFT adapters over the base model, resident in preallocated slots.

    adapter.py   a PEFT folder read and checked (LoraAdapter), refusing what it cannot run
    slots.py     the per-layer slot tensors the forward reads, and one step's slot plan
    manager.py   which adapters are registered, kept in host memory, resident in a slot
"""

from inflight.engine.lora.adapter import LoraAdapter, LoraError, load_adapter
from inflight.engine.lora.manager import LoraManager
from inflight.engine.lora.slots import LoraSlots, LoraStep

__all__ = ["LoraAdapter", "LoraError", "LoraManager", "LoraSlots", "LoraStep", "load_adapter"]

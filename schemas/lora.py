"""LoRA adapter commands for workers, on the control topic every worker reads outside its
group (`inflight.cancel`, INFLIGHT_TOPIC_CANCEL: cancels travel there too).

    {"type": "lora", "action": "load", "lora_name": "team-a", "lora_path": "/adapters/a",
     "model": "SmolLM2-135M-Instruct"}
    {"type": "lora", "action": "unload", "lora_name": "team-a", "model": null}

vLLM's body names (`lora_name`, `lora_path`); `model` is the base model whose workers act on
it (null: every worker). A worker loads the folder (read and checked: a bad one is logged,
the worker goes on), lists the adapter in its registry record, and routes requests naming
it; an unload takes it off once no unfinished request uses it. Workers read the topic from
INFLIGHT_CANCEL_LOOKBACK_S back at start, so one that starts within that window replays
the commands in order; a worker started later serves its own `--lora` adapters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import orjson

from inflight.schemas.base import MODEL_ID_RE

Action = Literal["load", "unload"]


@dataclass(frozen=True, slots=True)
class LoraCommand:
    action: Action
    lora_name: str
    lora_path: str | None = None
    model: str | None = None  # the base model (None: every worker)


def lora_command(cmd: LoraCommand) -> tuple[bytes, bytes]:
    """(key, value) of a command on the control topic."""
    return (f"lora {cmd.model or '*'} {cmd.lora_name}".encode(),
            orjson.dumps({"type": "lora", "action": cmd.action, "lora_name": cmd.lora_name,
                          "lora_path": cmd.lora_path, "model": cmd.model}))


def check_lora_command(cmd: LoraCommand) -> LoraCommand:
    """ValueError naming the field that is wrong."""
    if cmd.action not in ("load", "unload"):
        raise ValueError(f"action={cmd.action!r}: use 'load' or 'unload'")
    if not isinstance(cmd.lora_name, str) or not MODEL_ID_RE.match(cmd.lora_name):
        raise ValueError(f"lora_name={cmd.lora_name!r} is not a model id (visible ASCII, no "
                         "spaces, at most 128 characters)")
    if cmd.action == "load" and not (isinstance(cmd.lora_path, str) and cmd.lora_path):
        raise ValueError("lora_path is required to load an adapter (a PEFT folder the workers can read)")
    if cmd.model is not None and not (isinstance(cmd.model, str) and MODEL_ID_RE.match(cmd.model)):
        raise ValueError(f"model={cmd.model!r} is not a model id")
    return cmd


def parse_lora_command(obj: dict) -> LoraCommand | None:
    """The command of a control-topic object with type "lora", None when malformed."""
    try:
        return check_lora_command(LoraCommand(obj.get("action"), obj.get("lora_name"),
                                              obj.get("lora_path"), obj.get("model")))
    except ValueError:
        return None

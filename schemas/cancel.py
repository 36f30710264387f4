"""Messages on the cancel topic (`inflight.cancel`), read by every worker outside the group.

    {"request_id": "..."}   one request (a raw id as the value or the key is read too)
    {"batch_id": "..."}     every request of a batch: the queued ones end `cancelled` at
                            intake without running, the running ones are aborted. Workers
                            keep it for INFLIGHT_CANCEL_LOOKBACK_S, so one message covers a
                            batch of any size (a cancel per request would not: a worker
                            remembers a bounded number of cancelled request ids).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import orjson
from pydantic import ConfigDict, model_validator

from inflight.schemas.base import ID_RE, SCHEMA_VERSION, WireId, WireModel
from inflight.schemas.lora import LoraCommand, parse_lora_command


@dataclass(frozen=True, slots=True)
class Cancel:
    """One cancel: exactly one of the two is set (or, instead, a LoRA command for the
    workers: schemas/lora.py)."""

    request_id: str | None = None
    batch_id: str | None = None
    lora: LoraCommand | None = None


class CancelMessage(WireModel):
    """The JSON a cancel carries (the published contract, schemas/contract.py): exactly one
    of `request_id`, `batch_id`. Readers go through `parse_cancel`, which also takes a bare
    id and ignores fields it does not know."""

    model_config = ConfigDict(extra="ignore")

    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: WireId | None = None
    batch_id: WireId | None = None

    @model_validator(mode="after")
    def _one(self) -> "CancelMessage":
        if (self.request_id is None) == (self.batch_id is None):
            raise ValueError("set exactly one of 'request_id', 'batch_id'")
        return self


def request_cancel(request_id: str) -> tuple[bytes, bytes]:
    """(key, value) of a cancel of one request."""
    return request_id.encode(), orjson.dumps({"request_id": request_id})


def batch_cancel(batch_id: str) -> tuple[bytes, bytes]:
    """(key, value) of a cancel of every request of a batch."""
    return batch_id.encode(), orjson.dumps({"batch_id": batch_id})


def parse_cancel(value: bytes | None, key: bytes | None) -> Cancel | None:
    """The cancel a record carries, or None when it names no well-formed id. A value that
    is not a JSON object falls back to a request id (the value, then the key)."""
    for raw in (value, key):
        if not raw:
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            obj = raw.decode("utf-8", "replace").strip()
        if isinstance(obj, dict):
            if obj.get("type") == "lora":
                cmd = parse_lora_command(obj)
                return Cancel(lora=cmd) if cmd is not None else None
            if "batch_id" in obj and "request_id" not in obj:
                bid = obj["batch_id"]  # never read the key as a request id then
                return Cancel(batch_id=bid) if isinstance(bid, str) and ID_RE.match(bid) else None
            obj = obj.get("request_id")
        if isinstance(obj, str) and ID_RE.match(obj):
            return Cancel(request_id=obj)
    return None

"""Batch state events on `inflight.batch-events` (INFLIGHT_TOPIC_BATCH_EVENTS), key = the batch
id: the same bytes a webhook endpoint receives (producers/webhooks.py: `event_body`), in
OpenAI's webhook event shape:

    {"id": "evt_...", "object": "event", "type": "batch.completed", "created_at": 1767000000,
     "data": {"id": "batch_..."}}

Its schema_version is the record's `schema-version` header (the body has no field for it).
Readers ignore fields they do not know (schemas/contract.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from inflight.schemas.base import WireModel
from inflight.schemas.codec import load_object, schema_error, validate_open

BatchEventType = Literal["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]


class BatchEventData(WireModel):
    id: str = Field(min_length=1, max_length=256)    # the batch id


class BatchEvent(WireModel):
    """One batch state change (see the module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    id: str = Field(min_length=1, max_length=256)    # the event id (idempotency key)
    object: Literal["event"] = "event"
    type: BatchEventType
    created_at: int = Field(ge=0)                    # epoch seconds
    data: BatchEventData


def decode_batch_event(value: bytes) -> BatchEvent:
    """A batch-events record -> BatchEvent; SchemaError naming the field when it is not one."""
    from pydantic import ValidationError

    data, obj = load_object(value, max_bytes=1_000_000, what="batch event")
    try:
        return validate_open(BatchEvent.model_validate, obj)
    except ValidationError as exc:
        raise schema_error(exc, raw=data, request_id=None, model=BatchEvent) from None

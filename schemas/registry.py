"""The model registry: what each worker announces on the compacted topic `inflight.models`
(INFLIGHT_TOPIC_MODELS, one partition), so that the API, clients and batch jobs list and
route by the models that have live workers.

    key   = "<worker> <model>"        (registry_key: one record per worker and model)
    value = ModelRecord as JSON, or null (a tombstone: that worker stopped serving it)

    {"type": "model", "schema_version": 1, "model": "SmolLM2-135M-Instruct",
     "kind": "generate", "parent": null, "adapters": [], "max_model_len": 8192,
     "dtype": "float32", "quantization": null, "worker": "host:4242",
     "requests_topic": "inflight.requests", "batch_topic": "inflight.requests.batch",
     "group": "inflight-workers", "default": true,
     "heartbeat_at": 1767000000.0, "heartbeat_s": 5.0, "started_at": 1766999990.0}

A worker sends its record at start and every INFLIGHT_REGISTRY_HEARTBEAT_S (a new
`heartbeat_at`), and a tombstone when it stops gracefully; a reader keeps the last value
per key and counts a record live while `heartbeat_at` is within INFLIGHT_REGISTRY_TTL_S, so
a worker killed with -9 drops off after that window.

Open for what comes next: `kind: "embed"` for embedding models, and adapter entries (a
record whose `parent` names the base model it runs on; the base's record lists them in
`adapters`). Readers that do not know a kind yet still list it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationError

from inflight.schemas.base import SCHEMA_VERSION, ModelId, WireModel
from inflight.schemas.codec import load_object, schema_error, validate_open

DEFAULT_ALIAS = "default"   # a request's `model` that names the default model, whatever it is
Kind = Literal["generate", "embed"]
TopicName = Annotated[str, Field(min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._-]+$")]
MAX_ADAPTERS = 1024


class ModelRecord(WireModel):
    """One worker's announcement of one model it serves (see the module doc)."""

    type: Literal["model"] = "model"
    schema_version: Literal[1] = SCHEMA_VERSION
    model: ModelId
    kind: Kind = "generate"
    parent: ModelId | None = None                   # an adapter: its base model
    adapters: Annotated[list[ModelId], Field(max_length=MAX_ADAPTERS)] = Field(default_factory=list)
    max_model_len: int | None = Field(default=None, ge=1)
    dtype: Annotated[str, Field(max_length=32)] | None = None
    quantization: Annotated[str, Field(max_length=32)] | None = None
    worker: Annotated[str, Field(min_length=1, max_length=256)]
    requests_topic: TopicName
    batch_topic: TopicName
    group: Annotated[str, Field(min_length=1, max_length=256)]
    default: bool = False                            # reads the default model's topics
    heartbeat_at: float = Field(ge=0.0)
    heartbeat_s: float = Field(gt=0.0)
    started_at: float = Field(ge=0.0)

    @property
    def key(self) -> bytes:
        return registry_key(self.worker, self.model)


def registry_key(worker: str, model: str) -> bytes:
    """The Kafka key of a (worker, model) record: model ids and worker names hold no space."""
    return f"{worker} {model}".encode()


def decode_record(value: bytes) -> ModelRecord:
    """A registry value -> ModelRecord; SchemaError naming the field when it is not one.
    Fields it does not know are ignored (a newer worker's: schemas/contract.py)."""
    data, obj = load_object(value, max_bytes=1_000_000, what="registry record")
    try:
        return validate_open(ModelRecord.model_validate, obj)
    except ValidationError as exc:
        raise schema_error(exc, raw=data, request_id=None, model=ModelRecord) from None

"""The base every wire model shares: strict, frozen, no unknown fields, no NaN/inf.

NOTE: `schema_version` is a Literal on each model. A message written by a newer build
with an unknown version is rejected with a SchemaError naming `schema_version`, never
half-read.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints

SCHEMA_VERSION = 1

# Request ids and batch ids end up as Kafka keys, SQL primary keys and file names:
# letters, digits and `._:-`, starting with a letter or digit, at most 128 characters.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$"
ID_RE = re.compile(ID_PATTERN)
MAX_ID_LEN = 128

WireId = Annotated[str, StringConstraints(pattern=ID_PATTERN)]

# Model ids (a request's `model`, a worker's served model name): visible ASCII, no spaces,
# at most 128 characters ("SmolLM2-135M-Instruct", "google/gemma-3-270m", "team-a:adapter").
# Kafka topic names are made from them (transport/model_topics.py: a reversible escape).
MODEL_ID_PATTERN = r"^[!-~]{1,128}$"
MODEL_ID_RE = re.compile(MODEL_ID_PATTERN)
MAX_MODEL_ID_LEN = 128
ModelId = Annotated[str, StringConstraints(pattern=MODEL_ID_PATTERN)]

# Kafka topic names (Kafka's rule: 1-249 of letters, digits and . _ -)
TOPIC_PATTERN = r"^[A-Za-z0-9._-]{1,249}$"
TopicName = Annotated[str, StringConstraints(pattern=TOPIC_PATTERN)]


def _finite_json(value: Any, _depth: int = 0) -> Any:
    """Reject NaN/inf anywhere inside a free-form JSON value (metadata)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("NaN and infinity are not JSON; send a finite number or a string")
    if isinstance(value, dict):
        for v in value.values():
            _finite_json(v, _depth + 1)
    elif isinstance(value, list):
        for v in value:
            _finite_json(v, _depth + 1)
    return value


FiniteJson = AfterValidator(_finite_json)


class FieldError(ValueError):
    """A model-level validation failure that still knows which field is to blame."""

    def __init__(self, field: str, message: str, code: str = "invalid_request"):
        super().__init__(message)
        self.field = field
        self.code = code


class WireModel(BaseModel):
    """Strict and frozen: `"5"` is not 5, `true` is not 1, unknown fields are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False,
                              validate_default=False, ser_json_inf_nan="null")

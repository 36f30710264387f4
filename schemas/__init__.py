"""Wire messages, settings and the error tree. Imports nothing of the project.

Priority convention: LOWER number = MORE urgent (PRIORITY_INTERACTIVE = 0,
PRIORITY_BATCH = 10).
"""

from inflight.schemas.batch import parse_batch_line
from inflight.schemas.codec import (DEFAULT_MAX_BYTES, DEFAULT_MAX_PROMPT_CHARS, decode_request,
                           decode_result, encode, salvage_request_id)
from inflight.schemas.errors import (BrokerError, CapacityError, ConfigError, InflightError, ModelError,
                            ModelNotFoundError, NotFoundError, Retry, SchemaError, StateError,
                            StoreError)
from inflight.schemas.events import (ERR_CANCELLED, ERR_ENGINE, ERR_EXPIRED, ERR_INTERNAL,
                            ERR_INVALID_REQUEST, ERR_INVALID_SCHEMA, ERR_MESSAGE_TOO_LARGE,
                            ERR_PROMPT_TOO_LONG, FINISH_REASONS, ErrorEvent, FinalEvent, FinishReason, ResultEvent,
                            StatusEvent, Timings, TokenEvent, Usage)
from inflight.schemas.params import SamplingParams, StructuredOutputs
from inflight.schemas.requests import (PRIORITY_BATCH, PRIORITY_INTERACTIVE, ChatMessage,
                              InferenceRequest)
from inflight.schemas.settings import Settings

__all__ = [
    "BrokerError", "CapacityError", "ConfigError", "InflightError", "ModelError",
    "ModelNotFoundError", "Retry",
    "SchemaError", "Settings", "StoreError", "NotFoundError", "StateError",
    "SamplingParams", "StructuredOutputs", "ChatMessage", "InferenceRequest", "PRIORITY_BATCH", "PRIORITY_INTERACTIVE",
    "TokenEvent", "StatusEvent", "FinalEvent", "ErrorEvent", "ResultEvent", "Usage", "Timings", "FinishReason",
    "FINISH_REASONS", "ERR_CANCELLED", "ERR_ENGINE", "ERR_EXPIRED", "ERR_INTERNAL",
    "ERR_INVALID_REQUEST", "ERR_INVALID_SCHEMA", "ERR_MESSAGE_TOO_LARGE", "ERR_PROMPT_TOO_LONG",
    "encode", "decode_request", "decode_result", "salvage_request_id", "parse_batch_line",
    "DEFAULT_MAX_BYTES", "DEFAULT_MAX_PROMPT_CHARS",
]

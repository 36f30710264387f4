"""The root of the project's error tree, and the errors the engine raises.

Dependency-free on purpose: the engine imports it without the service stack, and the wire
(`inflight.schemas.errors`) builds the rest of the tree on `InflightError` from here.
Every message says what was wrong (with the values), which setting or field to change,
and what happens next.
"""

from __future__ import annotations


class InflightError(Exception):
    """Base of every error this project raises on purpose."""


class ConfigError(InflightError, ValueError):
    """A setting is missing or has a value that cannot work."""


class CapacityError(InflightError):
    """A request cannot fit (context length, KV cache, message size)."""


class ModelError(InflightError):
    """A model folder is missing, incomplete, or of an unsupported architecture."""


class EngineDeadError(InflightError):
    """The engine cannot run another step (a tensor-parallel rank died): a step raises it
    instead of failing its requests, and the process serving the engine should exit (a
    worker stops; its requests are redone elsewhere)."""


# Codes a request's error final carries (ErrorEvent.code on the wire, RequestOutput.error_code
# in the engine): an open lowercase identifier, so a new code needs no schema change.
ERR_INVALID_REQUEST = "invalid_request"   # not JSON / wrong schema / unknown fields
ERR_MESSAGE_TOO_LARGE = "message_too_large"
ERR_PROMPT_TOO_LONG = "prompt_too_long"   # over the model's context or max_prompt_chars
ERR_ENGINE = "engine_error"
ERR_INTERNAL = "internal_error"
ERR_CANCELLED = "cancelled"
ERR_EXPIRED = "expired"
ERR_STORE_REJECTED = "store_rejected"     # the database refused the request's row (recorder)
ERR_INVALID_SCHEMA = "invalid_schema"     # structured_outputs: a schema / regex / grammar that does not compile

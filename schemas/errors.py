"""One error tree for the whole project.

Every message says what was wrong (with the values), which setting or field to change,
and what happens next. Code that handles input never raises anything else at its edge.
"""

from __future__ import annotations

# the root and the engine's own errors live with the engine (which imports no wire code)
from inflight.engine.errors import (CapacityError, ConfigError, InflightError, MissingExtraError,
                                    ModelError, needs_extra, require_extra)

__all__ = ["InflightError", "SchemaError", "ConfigError", "CapacityError", "BrokerError",
           "StoreError", "NotFoundError", "StateError", "ModelError", "Retry",
           "MissingExtraError", "needs_extra", "require_extra"]


class SchemaError(InflightError, ValueError):
    """A wire message could not be decoded or validated.

    `raw` keeps the original bytes so nothing is lost (they go to the DLQ);
    `field` names the offending field when one is known; `code` is the ErrorEvent code
    ("invalid_request", "message_too_large", "prompt_too_long").
    """

    def __init__(self, message: str, *, raw: bytes | None = None, field: str | None = None,
                 request_id: str | None = None, code: str = "invalid_request"):
        super().__init__(message)
        self.message = message
        self.code = code
        self.raw = raw
        self.field = field
        self.request_id = request_id




class BrokerError(InflightError):
    """The Kafka broker could not be started, reached or used."""


class StoreError(InflightError):
    """The SQL store could not be reached or used."""


class NotFoundError(InflightError, LookupError):
    """A batch, file or request id that does not exist (or belongs to someone else)."""


class StateError(InflightError):
    """The object exists but its state forbids the operation (cancel a completed batch,
    read the results of a batch still running)."""



class Retry(InflightError):
    """Transient failure: try again after `delay` seconds."""

    def __init__(self, message: str, delay: float = 1.0):
        super().__init__(message)
        self.delay = delay

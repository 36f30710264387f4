"""The root of the project's error tree, and the errors the engine raises.

Dependency-free on purpose: the engine imports it without the service stack, and the wire
(`inflight.schemas.errors`) builds the rest of the tree on `InflightError` from here.
Every message says what was wrong (with the values), which setting or field to change,
and what happens next.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator


class InflightError(Exception):
    """Base of every error this project raises on purpose."""


class ConfigError(InflightError, ValueError):
    """A setting is missing or has a value that cannot work."""


class CapacityError(InflightError):
    """A request cannot fit (context length, KV cache, message size)."""


class ModelError(InflightError):
    """A model folder is missing, incomplete, or of an unsupported architecture."""


class MissingExtraError(InflightError, ImportError):
    """What was asked for needs an optional part of the install (an extra: worker, api, jobs)
    that is not installed. The message names the extra and the pip line that adds it;
    `extra` and `name` (the missing module) say the same to code."""

    def __init__(self, extra: str, what: str, module: str | None = None):
        missing = f"{module} is not installed" if module else "it is not installed"
        super().__init__(f"{what} needs the `{extra}` extra ({missing}): "
                         f"pip install 'inflight[{extra}]'")
        self.extra = extra
        self.name = module


@contextlib.contextmanager
def needs_extra(extra: str, what: str) -> Iterator[None]:
    """Turn a missing third-party module inside the block into a MissingExtraError that
    names `extra` (a module of the project itself missing is a bug: re-raised as is)."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if not exc.name or exc.name.partition(".")[0] == "inflight":
            raise
        raise MissingExtraError(extra, what, exc.name) from exc


def require_extra(extra: str, what: str, *modules: str) -> None:
    """MissingExtraError unless every module can be found (nothing is imported)."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(extra, what, module)


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
ERR_MODEL_NOT_FOUND = "model_not_found"   # a model or LoRA adapter this engine does not serve
ERR_INVALID_SCHEMA = "invalid_schema"     # structured_outputs: a schema / regex / grammar that does not compile

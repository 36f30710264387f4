"""orjson encode/decode at the edge. Decoders raise only SchemaError, whatever the input.

    raw bytes ── size check ── orjson.loads ── must be an object ── pydantic (strict) ──► model
                    │               │                  │                    │
                    └───────────────┴──── SchemaError(raw=..., field=..., request_id=salvaged)
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError

from inflight.schemas.base import ID_RE, MAX_ID_LEN, FieldError
from inflight.schemas.errors import SchemaError
from inflight.schemas.events import ResultEvent
from inflight.schemas.json_text import parse_json
from inflight.schemas.params import SamplingParamsError, StructuredOutputsError
from inflight.schemas.requests import InferenceRequest

DEFAULT_MAX_BYTES = 1_000_000        # = Settings.kafka_max_message_bytes default
DEFAULT_MAX_PROMPT_CHARS = 200_000   # = Settings.max_prompt_chars default

_RESULT_ADAPTER: TypeAdapter[Any] = TypeAdapter(ResultEvent)
_TAGS = ("token", "status", "final", "error")
_JSON_BRANCHES = frozenset({"list", "dict", "str", "int", "float", "bool"})


def encode(model: BaseModel) -> bytes:
    """Any wire model to compact JSON bytes."""
    return orjson.dumps(model.model_dump(mode="json"))


def salvage_request_id(obj: Any) -> str | None:
    """The request_id of a broken message, if it has a well-formed one."""
    if isinstance(obj, dict):
        rid = obj.get("request_id")
        if isinstance(rid, str) and ID_RE.match(rid):
            return rid
    return None


def _as_bytes(raw: Any) -> bytes:
    if isinstance(raw, bytes):
        return raw
    if isinstance(raw, (bytearray, memoryview)):
        return bytes(raw)
    if isinstance(raw, str):
        return raw.encode("utf-8", "surrogatepass")
    raise SchemaError(f"expected bytes, got {type(raw).__name__}", raw=None)


def load_object(raw: Any, *, max_bytes: int | None, what: str,
                forbid_nul: bool = False) -> tuple[bytes, dict[str, Any]]:
    """Bytes → a JSON object (dict), or SchemaError (schemas.json_text: the one parser)."""
    data = _as_bytes(raw)
    if max_bytes is not None and len(data) > max_bytes:
        rid = None
        try:
            rid = salvage_request_id(orjson.loads(data))
        except orjson.JSONDecodeError:
            pass
        raise SchemaError(f"{what} is {len(data)} bytes, over the limit of {max_bytes} "
                          "(setting INFLIGHT_KAFKA_MAX_MESSAGE_BYTES); shorten the prompt",
                          raw=data, field="message", request_id=rid, code="message_too_large")
    try:
        obj = parse_json(data, what=what, forbid_nul=forbid_nul)
    except SchemaError as e:
        # the wire's ErrorEvent code stays invalid_request; the message says what is wrong
        raise SchemaError(e.message, raw=data, field=e.field) from None
    if not isinstance(obj, dict):
        raise SchemaError(f"{what} must be a JSON object, got {type(obj).__name__}", raw=data)
    return data, obj


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def schema_error(err: ValidationError, *, raw: bytes | None, request_id: str | None,
                 model: type[BaseModel] | None = None, prefix: str = "",
                 strip_tag: bool = False) -> SchemaError:
    """Turn pydantic's error list into one SchemaError naming the first bad field."""
    errors = err.errors(include_url=False)
    first = errors[0]
    loc = list(first.get("loc", ()))
    if strip_tag and loc and loc[0] in _TAGS:
        loc = loc[1:]
    loc = [p for p in loc if not (isinstance(p, str) and p.startswith("function-"))]
    if "metadata" in loc:  # JsonValue adds its union branch names to the path
        loc = [p for p in loc if p not in _JSON_BRANCHES]
    field = prefix + ".".join(str(p) for p in loc) if loc else (prefix.rstrip(".") or None)
    kind = first.get("type", "")
    msg = first.get("msg", "invalid")
    cause = (first.get("ctx") or {}).get("error")
    code = "invalid_request"
    if isinstance(cause, FieldError):
        code = cause.code
        field = prefix + cause.field
        msg = str(cause)
        kind = "field_error"
    elif isinstance(cause, SamplingParamsError) and cause.field:
        field = f"{field}.{cause.field}" if field else prefix + cause.field
        msg = str(cause)
        kind = "field_error"
    elif isinstance(cause, StructuredOutputsError):
        # a schema / regex / grammar the grammar engine refuses: the compiler's message
        code = cause.code
        if cause.field and not (field or "").endswith(cause.field):
            field = f"{field}.{cause.field}" if field else prefix + cause.field
        msg = str(cause)
        kind = "field_error"
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        allowed = ""
        if model is not None and len(loc) == 1:
            allowed = "; allowed fields: " + ", ".join(model.model_fields)
        text = f"unknown field '{field}': remove it{allowed}"
    elif kind == "missing":
        text = f"missing required field '{field}'"
    elif kind == "string_pattern_mismatch" and loc and loc[-1] in ("request_id", "batch_id"):
        text = (f"{field}: use 1-{MAX_ID_LEN} characters of letters, digits and . _ : -, "
                f"starting with a letter or digit (got {_short(first.get('input'))})")
    elif kind == "field_error":
        text = f"{field}: {msg}"
    elif kind == "value_error" and not loc:
        text = msg.removeprefix("Value error, ")
    else:
        text = f"{field or 'message'}: {msg.removeprefix('Value error, ')}"
        if "input" in first and kind not in ("value_error", "finite_number"):
            text += f" (got {_short(first['input'])})"
    if len(errors) > 1:
        text += f" [+{len(errors) - 1} more error(s)]"
    return SchemaError(text, raw=raw, field=field, request_id=request_id, code=code)


def renamed_field(e: SchemaError, paths: tuple[tuple[str, str], ...]) -> SchemaError:
    """`e` with its field renamed by the first (ours, theirs) prefix pair that matches, in
    `field` and where the message names it, so the errors of a line that wraps a request
    (a Batch API line) name what its writer wrote: `params.max_tokens` -> `body.max_tokens`."""
    field, message = e.field, e.message
    if field:
        for ours, theirs in paths:
            if field.startswith(ours):
                new = theirs + field[len(ours):]
                message = message.replace(field, new, 1)
                field = new
                break
    return SchemaError(message, raw=e.raw, field=field, request_id=e.request_id, code=e.code)


def decode_request(raw: Any, *, max_bytes: int | None = DEFAULT_MAX_BYTES,
                   max_prompt_chars: int | None = DEFAULT_MAX_PROMPT_CHARS) -> InferenceRequest:
    """Bytes from `inflight.requests` → InferenceRequest. Raises only SchemaError."""
    data, obj = load_object(raw, max_bytes=max_bytes, what="request")
    return request_from_object(obj, raw=data, max_prompt_chars=max_prompt_chars)


def request_from_object(obj: dict[str, Any], *, raw: bytes | None,
                        max_prompt_chars: int | None = DEFAULT_MAX_PROMPT_CHARS,
                        prefix: str = "") -> InferenceRequest:
    rid = salvage_request_id(obj)
    try:
        return InferenceRequest.model_validate(
            obj, context={"max_prompt_chars": max_prompt_chars})
    except ValidationError as e:
        raise schema_error(e, raw=raw, request_id=rid, model=InferenceRequest,
                           prefix=prefix) from None
    except (ValueError, TypeError, RecursionError) as e:  # defensive: never leak other types
        raise SchemaError(f"invalid request: {e}", raw=raw, request_id=rid) from None


def drop_unknown(obj: dict[str, Any], err: ValidationError, *, tagged: bool = False) -> bool:
    """Delete from `obj` (in place) every field `err` calls unknown (extra_forbidden);
    whether any was. `tagged`: the error paths start with a union's tag (result events)."""
    dropped = False
    for e in err.errors(include_url=False):
        if e.get("type") != "extra_forbidden":
            continue
        loc = list(e.get("loc", ()))
        if tagged and loc and loc[0] in _TAGS:
            loc = loc[1:]
        parent: Any = obj
        for part in loc[:-1]:
            try:
                parent = parent[part]
            except (KeyError, IndexError, TypeError):
                parent = None
                break
        if isinstance(parent, dict) and loc and loc[-1] in parent:
            del parent[loc[-1]]
            dropped = True
    return dropped


def validate_open(validate: Any, obj: dict[str, Any], *, tagged: bool = False) -> Any:
    """`validate(obj)`, ignoring fields the model does not know (a newer writer's optional
    fields): what every reader of the project's own output does (schemas/contract.py)."""
    try:
        return validate(obj)
    except ValidationError as e:
        if not drop_unknown(obj, e, tagged=tagged):
            raise
    return validate(obj)


def decode_result(raw: Any, *, max_bytes: int | None = None) -> ResultEvent:
    """Bytes from `inflight.results` / `inflight.results.tokens` → TokenEvent | StatusEvent |
    FinalEvent | ErrorEvent (by `type`). Fields it does not know are ignored (a newer
    writer's: schemas/contract.py); everything else is checked strictly."""
    data, obj = load_object(raw, max_bytes=max_bytes, what="result event")
    rid = salvage_request_id(obj)
    try:
        return validate_open(_RESULT_ADAPTER.validate_python, obj, tagged=True)
    except ValidationError as e:
        raise schema_error(e, raw=data, request_id=rid, strip_tag=True) from None
    except (ValueError, TypeError, RecursionError) as e:
        raise SchemaError(f"invalid result event: {e}", raw=data, request_id=rid) from None

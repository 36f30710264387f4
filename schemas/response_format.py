"""The body keys of an OpenAI-style request that constrain its output, as one
`structured_outputs` (engine/structured_outputs.py):

    response_format: {"type": "text"}                           -> none
                     {"type": "json_object"}                    -> {"json_object": true}
                     {"type": "json_schema", "json_schema":
                        {"name": ..., "schema": {...}, "strict": ...}}  -> {"json": schema}
    structured_outputs: {...}                                   -> as given (vLLM's)
    guided_json / guided_regex / guided_choice / guided_grammar -> {"json"|"regex"|"choice"|"grammar": ...}
                                                                   (vLLM's older names)

`strict` is accepted either way: the output always matches the schema (the mask enforces
it). At most one of these keys may constrain a request; a schema the grammar engine refuses
is a SchemaError with code "invalid_schema" naming the key the caller wrote.
"""

from __future__ import annotations

from typing import Any

from inflight.schemas.errors import SchemaError
from inflight.schemas.params import StructuredOutputs, StructuredOutputsError

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}
_FORMAT_KEYS = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}


def structured_outputs(body: dict[str, Any], raw: bytes | None, rid: str | None,
                       where: str = "body.") -> dict[str, Any] | None:
    """The one constraint the body asks for, or None."""
    found: list[tuple[str, dict[str, Any]]] = []
    rf = body.get("response_format")
    if rf is not None:
        so = _response_format(rf, raw, rid, where)
        if so is not None:
            found.append(("response_format", so))
    if body.get("structured_outputs") is not None:
        found.append(("structured_outputs", body["structured_outputs"]))
    for key, kind in _GUIDED.items():
        if body.get(key) is not None:
            found.append((key, {kind: body[key]}))
    if len(found) > 1:
        keys = " and ".join(k for k, _ in found)
        raise SchemaError(f"{where}{found[1][0]}: give one output constraint (got {keys})",
                          raw=raw, field=f"{where}{found[1][0]}", request_id=rid)
    return found[0][1] if found else None


def _response_format(rf: Any, raw: bytes | None, rid: str | None, where: str) -> dict | None:
    field = f"{where}response_format"

    def fail(msg: str, at: str = "", code: str = "invalid_request") -> SchemaError:
        return SchemaError(f"{field}{at}: {msg}", raw=raw, field=field + at, request_id=rid,
                           code=code)

    if not isinstance(rf, dict) or rf.get("type") not in _FORMAT_KEYS:
        raise fail("give {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": "
                   "\"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}")
    kind = rf["type"]
    extra = sorted(set(rf) - _FORMAT_KEYS[kind])
    if extra:
        raise fail(f"unknown field(s) {extra} for type {kind!r}", f".{extra[0]}")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    spec = rf.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
        raise fail("give {\"name\": ..., \"schema\": {...}, \"strict\": true}", ".json_schema")
    extra = sorted(set(spec) - {"name", "description", "schema", "strict"})
    if extra:
        raise fail(f"unknown field(s) {extra}", f".json_schema.{extra[0]}")
    if "strict" in spec and not isinstance(spec["strict"], (bool, type(None))):
        raise fail("must be true or false", ".json_schema.strict")
    schema = spec.get("schema")
    if schema is None:
        return {"json_object": True}  # no schema: any JSON object
    try:
        StructuredOutputs(json=schema)
    except StructuredOutputsError as exc:
        raise fail(str(exc), ".json_schema.schema", exc.code) from None
    return {"json": schema}

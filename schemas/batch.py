"""Batch-file lines (JSONL): our own InferenceRequest lines, or OpenAI Batch API lines.

OpenAI line:
    {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "...", "messages": [...], "max_tokens": 64, "temperature": 0}}

`custom_id` becomes `request_id`, `body.model` the request's model (the batch job checks
that a live worker serves it: producers/batch_lines.py). Body parameters we cannot honour
are rejected by name (SchemaError); harmless ones (`user`, `n: 1`, `stream: false`, zero
penalties) are ignored. Requests read from a batch file get `batch_id` and, unless the line sets one,
`priority=PRIORITY_BATCH` (lower number = more urgent, so batch work yields).
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError

from inflight.schemas.base import ID_RE, MAX_ID_LEN
from inflight.schemas.codec import (DEFAULT_MAX_BYTES, DEFAULT_MAX_PROMPT_CHARS, load_object,
                                    renamed_field, request_from_object, salvage_request_id,
                                    schema_error)
from inflight.schemas.errors import SchemaError
from inflight.schemas.response_format import structured_outputs
from inflight.schemas.requests import PRIORITY_BATCH, InferenceRequest

COMPLETIONS_URL = "/v1/completions"
CHAT_URL = "/v1/chat/completions"
EMBEDDINGS_URL = "/v1/embeddings"  # body: model, input (one text or token-id list), dimensions

# body key -> SamplingParams field
_PARAM_MAP = {
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",              # vLLM extension
    "seed": "seed",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",  # vLLM extension
    "ignore_eos": "ignore_eos",    # vLLM extension
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "logit_bias": "logit_bias",
    "repetition_penalty": "repetition_penalty",  # vLLM extensions from here on
    "min_p": "min_p",
    "min_tokens": "min_tokens",
    "bad_words": "bad_words",
    "allowed_token_ids": "allowed_token_ids",
}
_IGNORED = {"user", "metadata", "store", "service_tier"}
# key -> values that mean "the default", which we can ignore
_HARMLESS_IF = {
    "n": (1,),
    "best_of": (None, 1),
    "stream": (None, False),
    "echo": (None, False),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "suffix": (None, ""),
    "stream_options": (None,),
}
_WHY = {"n": " in a batch line (a line is one request: submit n lines; n > 1 is supported by "
              "/v1/chat/completions and /v1/completions without stream)",
        "best_of": " (candidates are not ranked by log probability)"}
# body keys that constrain the output (schemas.structured: -> params.structured_outputs) and
# the tool keys (-> InferenceRequest.tools / tool_choice / parallel_tool_calls)
_STRUCTURED = {"response_format", "structured_outputs", "guided_json", "guided_regex",
               "guided_choice", "guided_grammar", "guided_decoding_backend"}
_TOOLS = ("tools", "tool_choice", "parallel_tool_calls")


def parse_batch_line(line: Any, *, batch_id: str | None = None, line_no: int | None = None,
                     max_bytes: int | None = DEFAULT_MAX_BYTES,
                     max_prompt_chars: int | None = DEFAULT_MAX_PROMPT_CHARS) -> InferenceRequest:
    """One JSONL line → InferenceRequest. Raises only SchemaError (message says which line)."""
    where = f"line {line_no}: " if line_no is not None else ""
    try:
        data, obj = load_object(line, max_bytes=max_bytes, what="batch line")
        if "custom_id" in obj:
            fields = _openai_fields(obj, data)
            try:
                req = request_from_object(fields, raw=data, max_prompt_chars=max_prompt_chars)
            except SchemaError as e:
                raise renamed_field(e, _OPENAI_PATHS) from None
        else:
            req = request_from_object(obj, raw=data, max_prompt_chars=max_prompt_chars)
            fields = obj
    except SchemaError as e:
        if where:
            raise SchemaError(where + e.message, raw=e.raw, field=e.field,
                              request_id=e.request_id, code=e.code) from None
        raise
    update: dict[str, Any] = {}
    if batch_id is not None and req.batch_id is None:
        update["batch_id"] = batch_id
    if "priority" not in fields:
        update["priority"] = PRIORITY_BATCH
    if update:
        data_ = req.model_dump()
        data_.update(update)
        try:
            req = InferenceRequest.model_validate(data_)
        except ValidationError as e:
            raise schema_error(e, raw=data, request_id=req.request_id) from None
    return req


def _js(value: Any) -> str:
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _same(value: Any, ok: Any) -> bool:
    """Equal and of the same JSON kind (true is not 1; 0 and 0.0 are both numbers)."""
    if isinstance(value, bool) or isinstance(ok, bool):
        return type(value) is type(ok) and value == ok
    if isinstance(value, (int, float)) and isinstance(ok, (int, float)):
        return value == ok
    return type(value) is type(ok) and value == ok


# InferenceRequest field path -> the OpenAI line's path, so errors name what the user wrote
_OPENAI_PATHS = (("request_id", "custom_id"), ("params.", "body."), ("messages", "body.messages"),
                 ("model", "body.model"),
                 ("prompt_token_ids", "body.prompt"), ("prompt", "body.prompt"))


def _fail(msg: str, raw: bytes, field: str | None, rid: str | None) -> SchemaError:
    return SchemaError(msg, raw=raw, field=field, request_id=rid)


def _openai_fields(obj: dict[str, Any], raw: bytes) -> dict[str, Any]:
    """Map an OpenAI Batch line onto InferenceRequest fields (validated afterwards); the
    custom_id is the request_id."""
    custom_id = obj.get("custom_id")
    rid = custom_id if isinstance(custom_id, str) and ID_RE.match(custom_id) else None
    if rid is None:
        raise _fail(f"custom_id: use 1-{MAX_ID_LEN} characters of letters, digits and . _ : -, "
                    f"starting with a letter or digit (got {custom_id!r:.80})", raw, "custom_id", None)
    return _openai_body_fields(obj, raw, rid)


def openai_batch_request(obj: dict[str, Any], raw: bytes, *, request_id: str,
                         batch_id: str | None = None, priority: int = PRIORITY_BATCH,
                         stream: bool | None = False,
                         max_prompt_chars: int | None = DEFAULT_MAX_PROMPT_CHARS) -> InferenceRequest:
    """An OpenAI Batch line already loaded (`obj`, from `raw`) → InferenceRequest with the
    given request_id (batch jobs derive it from batch id + custom_id, so custom_id may be
    any string). Checks method, url (one of ours), body and parameters; raises SchemaError
    naming the line's own field paths (body.max_tokens, ...)."""
    fields = _openai_body_fields(obj, raw, request_id)
    fields.update(batch_id=batch_id, priority=priority, stream=stream)
    try:
        return request_from_object(fields, raw=raw, max_prompt_chars=max_prompt_chars)
    except SchemaError as e:
        raise renamed_field(e, _OPENAI_PATHS) from None


def _openai_body_fields(obj: dict[str, Any], raw: bytes, rid: str) -> dict[str, Any]:
    extra = sorted(set(obj) - {"custom_id", "method", "url", "body"})
    if extra:
        raise _fail(f"unknown field(s) {', '.join(map(repr, extra))} in an OpenAI Batch line: "
                    "remove them; allowed: custom_id, method, url, body", raw, extra[0], rid)
    if obj.get("method", "POST") != "POST":
        raise _fail(f"method: only POST is supported (got {obj.get('method')!r:.40})", raw, "method", rid)
    url = obj.get("url")
    if url not in (COMPLETIONS_URL, CHAT_URL, EMBEDDINGS_URL):
        raise _fail(f"url: use {COMPLETIONS_URL!r}, {CHAT_URL!r} or {EMBEDDINGS_URL!r} "
                    f"(got {url!r:.80})", raw, "url", rid)
    body = obj.get("body")
    if not isinstance(body, dict):
        raise _fail(f"body: must be a JSON object (got {type(body).__name__})", raw, "body", rid)
    if url == EMBEDDINGS_URL:
        return _embedding_fields(body, raw, rid)

    fields: dict[str, Any] = {"request_id": rid}
    params: dict[str, Any] = {}
    unknown: list[str] = []
    for key, value in body.items():
        if key in _PARAM_MAP:
            if value is not None or key == "seed":
                params[_PARAM_MAP[key]] = value
        elif key == "model":
            if value is not None:
                fields["model"] = value
        elif key in _IGNORED:
            continue
        elif key in _HARMLESS_IF:
            if not any(_same(value, ok) for ok in _HARMLESS_IF[key]):
                raise _fail(f"body.{key}: {_js(value)} is not supported{_WHY.get(key, '')}; "
                            f"remove it or use {_js(_HARMLESS_IF[key][-1])}", raw, f"body.{key}", rid)
        elif key in ("prompt", "messages") or key in _STRUCTURED:
            continue
        elif key in _TOOLS:
            if value is not None:
                if url != CHAT_URL:
                    raise _fail(f"body.{key}: tools are for {CHAT_URL}", raw, f"body.{key}", rid)
                fields[key] = value
        else:
            unknown.append(key)
    if unknown:
        raise _fail(f"body: unsupported parameter(s) {', '.join(map(repr, sorted(unknown)))}; "
                    "remove them (supported: prompt/messages, " + ", ".join(_PARAM_MAP) + ")",
                    raw, f"body.{sorted(unknown)[0]}", rid)
    so = structured_outputs(body, raw, rid)
    if so is not None:
        params["structured_outputs"] = so
    if params:
        fields["params"] = params

    if url == CHAT_URL:
        if "prompt" in body:
            raise _fail(f"body.prompt: {CHAT_URL} takes 'messages'; use {COMPLETIONS_URL} for a "
                        "prompt", raw, "body.prompt", rid)
        if "messages" not in body:
            raise _fail("missing required field 'body.messages'", raw, "body.messages", rid)
        fields["messages"] = _messages(body["messages"], raw, rid)
    else:
        if "messages" in body:
            raise _fail(f"body.messages: {COMPLETIONS_URL} takes 'prompt'; use {CHAT_URL} for "
                        "messages", raw, "body.messages", rid)
        if "prompt" not in body:
            raise _fail("missing required field 'body.prompt'", raw, "body.prompt", rid)
        fields.update(_prompt(body["prompt"], raw, rid))
    return fields


def _embedding_fields(body: dict[str, Any], raw: bytes, rid: str) -> dict[str, Any]:
    """An OpenAI Batch line for /v1/embeddings: one input per line (a string or token ids),
    as a request of kind "embed"; its output line carries the float vector."""
    unknown = sorted(set(body) - {"model", "input", "dimensions", "encoding_format", "user"})
    if unknown:
        raise _fail(f"body: unsupported parameter(s) {', '.join(map(repr, unknown))} for "
                    f"{EMBEDDINGS_URL}; supported: model, input, dimensions, encoding_format",
                    raw, f"body.{unknown[0]}", rid)
    if body.get("encoding_format", "float") not in ("float", None):
        raise _fail("body.encoding_format: batch output lines carry float vectors; use 'float' "
                    "or leave it out", raw, "body.encoding_format", rid)
    if "input" not in body:
        raise _fail("missing required field 'body.input'", raw, "body.input", rid)
    x = body["input"]
    if isinstance(x, list) and len(x) == 1 and isinstance(x[0], (str, list)):
        x = x[0]
    if isinstance(x, str):
        fields: dict[str, Any] = {"prompt": x}
    elif isinstance(x, list) and x and all(isinstance(t, int) and not isinstance(t, bool) for t in x):
        fields = {"prompt_token_ids": x}
    else:
        raise _fail("body.input: give one string or one list of token ids (one input per line; "
                    "split a list of inputs into several lines)", raw, "body.input", rid)
    fields.update(request_id=rid, kind="embed")
    if body.get("model") is not None:
        fields["model"] = body["model"]
    if body.get("dimensions") is not None:
        fields["dimensions"] = body["dimensions"]
    return fields


def _prompt(prompt: Any, raw: bytes, rid: str) -> dict[str, Any]:
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return {"prompt": prompt[0]}
    if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return {"prompt_token_ids": prompt}
    raise _fail("body.prompt: give one string or one list of token ids (one prompt per line; "
                "split multi-prompt lists into several lines)", raw, "body.prompt", rid)


def _messages(messages: Any, raw: bytes, rid: str) -> Any:
    """Flatten OpenAI content parts ([{"type": "text", "text": ...}]) into plain strings."""
    if not isinstance(messages, list):
        return messages  # the model validator reports the type error
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, dict) and m.get("content") is None and m.get("role") == "assistant":
            m = {**m, "content": ""}  # an assistant turn that only called tools
        if isinstance(m, dict) and isinstance(m.get("content"), list):
            texts = []
            for part in m["content"]:
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise _fail(f"body.messages.{i}.content: only text parts are supported",
                                raw, f"body.messages.{i}.content", rid)
                texts.append(part["text"])
            m = {**m, "content": "".join(texts)}
        out.append(m)
    return out


__all__ = ["parse_batch_line", "openai_batch_request", "salvage_request_id", "COMPLETIONS_URL",
           "CHAT_URL", "EMBEDDINGS_URL"]

"""The published Kafka contract: one JSON Schema per message, generated from the wire models,
committed per schema version under schemas/json/v<N>/ with example messages
(docs/kafka-contract.md).

    schemas/json/v1/index.json                  topics -> messages -> schema files
    schemas/json/v1/<message>.schema.json       JSON Schema (draft 2020-12)
    schemas/json/v1/headers.schema.json         the record headers we write and copy
    schemas/json/v1/examples/<message>*.json    example messages (frozen once released)

`python -m inflight.schemas.export` writes the current version's folder; `--check` fails
when it differs from what is committed (tests/schemas/test_contract.py runs it). Earlier
versions' folders are never rewritten: the compatibility test reads every one of them with
today's readers.

NOTE (what is open, what is strict): requests and cancels are read strictly by the
workers (an unknown request field is a typo to report, not to ignore: upgrade the workers
before producers send a new field); everything the project writes -- result events, model
records -- is read tolerantly: a reader drops fields it does not know (codec.decode_result,
registry.decode_record), so a newer writer's optional fields never break an older reader.
The schemas say so: `additionalProperties: false` stays on the strict messages only.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, TypeAdapter

from inflight.schemas import headers as h
from inflight.schemas.base import SCHEMA_VERSION
from inflight.schemas.batch_event import BatchEvent, decode_batch_event
from inflight.schemas.cancel import CancelMessage, parse_cancel
from inflight.schemas.codec import decode_request, decode_result
from inflight.schemas.events import ErrorEvent, FinalEvent, ResultEvent, StatusEvent, TokenEvent
from inflight.schemas.registry import ModelRecord, decode_record
from inflight.schemas.requests import InferenceRequest

CONTRACT_DIR = Path(__file__).resolve().parent / "json"
DIALECT = "https://json-schema.org/draft/2020-12/schema"
ID_BASE = "https://inflight.dev/schemas"


@dataclass(frozen=True)
class Message:
    """One kind of message: its schema's source, topics, reader, and whether readers are
    strict (unknown fields refused) or open (unknown fields ignored)."""

    name: str
    source: Any                       # a pydantic model or a TypeAdapter-able type
    topics: tuple[str, ...]
    description: str
    strict: bool
    read: Callable[[bytes], Any]


def _read_cancel(value: bytes) -> Any:
    cancel = parse_cancel(value, None)
    if cancel is None:
        raise ValueError("not a cancel")
    return cancel


MESSAGES: tuple[Message, ...] = (
    Message("request", InferenceRequest,
            ("inflight.requests", "inflight.requests.batch", "inflight.requests.<model>",
             "inflight.requests.batch.<model>"),
            "An inference request (key: its request_id). Exactly one of prompt, messages, "
            "prompt_token_ids. Unknown fields are refused (an error final names them).",
            True, decode_request),
    Message("result-event", ResultEvent, ("inflight.results", "inflight.results.tokens",
                                          "<reply_to>"),
            "Any event of a request (key: request_id), by its `type`: token, status, final, "
            "error. Readers ignore fields they do not know.", False, decode_result),
    Message("token-event", TokenEvent, ("inflight.results.tokens", "<reply_to>"),
            "A coalesced delta of new tokens (only for requests that stream).", False,
            decode_result),
    Message("status-event", StatusEvent, ("inflight.results",),
            "A worker admitted the request (once per attempt).", False, decode_result),
    Message("final-event", FinalEvent, ("inflight.results", "<reply_to>"),
            "The one final event of a request that ran.", False, decode_result),
    Message("error-event", ErrorEvent, ("inflight.results", "<reply_to>"),
            "The final event of a request that could not run.", False, decode_result),
    Message("cancel", CancelMessage, ("inflight.cancel",),
            "Abort one request, or every request of a batch (key: the id). A bare id as "
            "the value is read too.", False, _read_cancel),
    Message("model-record", ModelRecord, ("inflight.models",),
            "A worker's announcement of a model it serves (compacted; key: '<worker> "
            "<model>'; a null value is a tombstone). Readers ignore fields they do not know.",
            False, decode_record),
    Message("batch-event", BatchEvent, ("inflight.batch-events",),
            "A batch state change (key: the batch id), the same bytes a webhook receives. "
            "Readers ignore fields they do not know.", False, decode_batch_event),
)
BY_NAME = {m.name: m for m in MESSAGES}

DEAD_LETTER = {
    "topics": ["inflight.requests.dlq"],
    "description": "A request that could not run, as it was received (its bytes and "
                   "headers), plus inflight-error-code / inflight-error / inflight-source "
                   "headers (and inflight-truncated / inflight-original-bytes when its body "
                   "was cut). The body follows no schema: it is whatever was sent.",
}


def _open(schema: Any) -> Any:
    """`schema` without `additionalProperties: false` anywhere (readers ignore extras)."""
    if isinstance(schema, dict):
        return {k: _open(v) for k, v in schema.items()
                if not (k == "additionalProperties" and v is False)}
    if isinstance(schema, list):
        return [_open(v) for v in schema]
    return schema


def message_schema(msg: Message, version: int = SCHEMA_VERSION) -> dict[str, Any]:
    """The JSON Schema of one message, as committed."""
    if isinstance(msg.source, type) and issubclass(msg.source, BaseModel):
        body = msg.source.model_json_schema(mode="validation")
    else:
        body = TypeAdapter(msg.source).json_schema(mode="validation")
    if not msg.strict:
        body = _open(body)
    if msg.source is InferenceRequest:  # the model validator's rule, for schema readers
        body["oneOf"] = [{"required": [f], "properties": {f: {"not": {"type": "null"}}}}
                         for f in ("prompt", "messages", "prompt_token_ids")]
    doc = body.pop("description", None)
    head = {"$schema": DIALECT, "$id": f"{ID_BASE}/v{version}/{msg.name}.schema.json",
            "title": body.pop("title", msg.name),
            "description": msg.description + (f"\n\n{doc}" if doc else ""),
            "x-inflight-topics": list(msg.topics), "x-inflight-schema-version": version,
            "x-inflight-readers": "strict" if msg.strict else "ignore unknown fields"}
    return {**head, **body}


def headers_schema(version: int = SCHEMA_VERSION) -> dict[str, Any]:
    """The record headers we write and copy (values as UTF-8 text)."""
    text = {"type": "string"}
    return {
        "$schema": DIALECT, "$id": f"{ID_BASE}/v{version}/headers.schema.json",
        "title": "Record headers",
        "description": "Kafka record headers as a name -> UTF-8 value object. Every message "
                       "we write carries content-type and schema-version; a request and "
                       "each of its events carry inflight-request-id, inflight-tenant (when "
                       "the request names a tenant) and the request's traceparent/tracestate. "
                       "Any other header of a request is copied unchanged onto its events "
                       "and never read by us.",
        "type": "object",
        "properties": {
            h.CONTENT_TYPE: {"const": h.JSON.decode()},
            h.SCHEMA_VERSION_HEADER: {"const": str(version)},
            h.REQUEST_ID: {**text, "pattern": r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$"},
            h.TENANT: text,
            h.TRACEPARENT: {**text, "pattern": h.TRACEPARENT_RE.pattern.decode()},
            h.TRACESTATE: {**text, "maxLength": 512},
            "inflight-error-code": {**text, "description": "dead letters: the error code"},
            "inflight-error": {**text, "description": "dead letters: the error message"},
            "inflight-source": {**text, "description": "dead letters: topic/partition/offset"},
            "inflight-truncated": {**text, "description": "dead letters: what was cut"},
            "inflight-original-bytes": {**text, "pattern": "^[0-9]+$"},
        },
        "required": [h.CONTENT_TYPE, h.SCHEMA_VERSION_HEADER],
        "additionalProperties": text,
    }


def index(version: int = SCHEMA_VERSION) -> dict[str, Any]:
    topics: dict[str, list[str]] = {}
    for msg in MESSAGES:
        if msg.name == "result-event":
            continue  # the union of the four events below
        for topic in msg.topics:
            topics.setdefault(topic, []).append(f"{msg.name}.schema.json")
    topics["inflight.requests.dlq"] = ["(the bytes of the request as sent)"]
    return {"schema_version": version, "topics": topics, "headers": "headers.schema.json",
            "dead_letter": DEAD_LETTER,
            "messages": {m.name: {"schema": f"{m.name}.schema.json", "topics": list(m.topics),
                                  "readers": "strict" if m.strict else "ignore unknown fields"}
                         for m in MESSAGES}}


# Example messages of the current version: the compatibility corpus once released (a later
# version keeps this folder as it is, and its readers must accept every file in it).
_SUBMITTED = 1767000000.0
EXAMPLES: dict[str, dict[str, Any]] = {
    "request.prompt": {"schema_version": 1, "request_id": "req-0001", "prompt": "Hello",
                       "params": {"max_tokens": 16, "temperature": 0.0},
                       "submitted_at": _SUBMITTED},
    "request.minimal": {"request_id": "req-0002", "prompt": "Write a haiku about Kafka"},
    "request.chat": {
        "schema_version": 1, "request_id": "req-0003", "model": "SmolLM2-135M-Instruct",
        "messages": [{"role": "system", "content": "Answer briefly."},
                     {"role": "user", "content": "What is a consumer group?"}],
        "params": {"max_tokens": 64, "temperature": 0.7, "top_p": 0.9, "seed": 7,
                   "stop": ["\n\n"]},
        "priority": 10, "batch_id": "batch-42", "metadata": {"source": "nightly", "n": 3},
        "submitted_at": _SUBMITTED, "stream": False},
    "request.reply-to": {"request_id": "req-0006", "prompt": "Summarize the log",
                         "params": {"max_tokens": 32}, "reply_to": "team-a.replies",
                         "stream": True},
    "request.token-ids": {"request_id": "req-0004", "prompt_token_ids": [1, 15043, 29892],
                          "params": {"max_tokens": 4, "ignore_eos": True}},
    "request.embed": {"request_id": "req-0007", "model": "all-MiniLM-L6-v2", "kind": "embed",
                      "prompt": "a passage to search", "dimensions": 128, "stream": False},
    "final-event.embed": {
        "type": "final", "schema_version": 1, "request_id": "req-0007", "attempt": "host:4242.9",
        "text": "", "token_ids": [], "finish_reason": "stop",
        "usage": {"prompt_tokens": 6, "completion_tokens": 0, "cached_prompt_tokens": 0},
        "worker": "host:4242", "model": "all-MiniLM-L6-v2",
        "embedding": "AAAAPwAAoL8AAIA/AAAAAA=="},
    "token-event": {"type": "token", "schema_version": 1, "request_id": "req-0001",
                    "attempt": "host:4242.7", "index": 0, "start": 0,
                    "token_ids": [22557, 29991], "text": "Hi!"},
    "status-event": {"type": "status", "schema_version": 1, "request_id": "req-0001",
                     "attempt": "host:4242.7", "status": "running", "worker": "host:4242",
                     "at": _SUBMITTED + 0.01},
    "final-event": {
        "type": "final", "schema_version": 1, "request_id": "req-0001",
        "attempt": "host:4242.7", "text": "Hi! How can I help?",
        "token_ids": [22557, 29991, 1128, 508, 306, 1371, 29973], "finish_reason": "stop",
        "usage": {"prompt_tokens": 2, "completion_tokens": 7, "cached_prompt_tokens": 0},
        "timings": {"submitted_at": _SUBMITTED, "queued_at": _SUBMITTED + 0.005,
                    "scheduled_at": None, "first_token_at": _SUBMITTED + 0.03,
                    "finished_at": _SUBMITTED + 0.09},
        "worker": "host:4242", "batch_id": None, "model": "SmolLM2-135M-Instruct"},
    "error-event": {"type": "error", "schema_version": 1, "request_id": "req-0005",
                    "attempt": None, "code": "invalid_request",
                    "message": "params.max_tokens: Input should be greater than or equal to 1 "
                               "(got 0)", "field": "params.max_tokens", "final": True,
                    "worker": "host:4242", "batch_id": None},
    "cancel.request": {"request_id": "req-0001"},
    "cancel.batch": {"batch_id": "batch-42"},
    "model-record": {
        "type": "model", "schema_version": 1, "model": "SmolLM2-135M-Instruct",
        "kind": "generate", "parent": None, "adapters": [], "max_model_len": 8192,
        "dtype": "float32", "quantization": None, "worker": "host:4242",
        "requests_topic": "inflight.requests", "batch_topic": "inflight.requests.batch",
        "group": "inflight-workers", "default": True, "heartbeat_at": _SUBMITTED,
        "heartbeat_s": 5.0, "started_at": _SUBMITTED - 10.0},
    "batch-event": {"id": "evt_7f3a9c", "object": "event", "type": "batch.completed",
                    "created_at": 1767000000, "data": {"id": "batch_42"}},
}


def example_message(example: str) -> str:
    """The message name an example file is of ("request.chat" -> "request")."""
    return example.split(".", 1)[0]


def render(version: int = SCHEMA_VERSION) -> dict[str, Any]:
    """Every file of the current version's folder: relative path -> JSON value."""
    files: dict[str, Any] = {"index.json": index(version),
                             "headers.schema.json": headers_schema(version)}
    for msg in MESSAGES:
        files[f"{msg.name}.schema.json"] = message_schema(msg, version)
    for name, body in EXAMPLES.items():
        files[f"examples/{name}.json"] = copy.deepcopy(body)
    return files


def committed_versions(root: Path = CONTRACT_DIR) -> list[int]:
    """The schema versions with a committed folder (v1, v2, ...), ascending."""
    if not root.is_dir():
        return []
    return sorted(int(p.name[1:]) for p in root.iterdir()
                  if p.is_dir() and p.name[:1] == "v" and p.name[1:].isdigit())

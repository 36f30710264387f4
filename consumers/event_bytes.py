"""Our own result events as bytes, built straight from plain values with orjson.

NOTE: no pydantic here: this is the hot path (one token delta per streaming request per
flush). The shapes are exactly schemas.events' (tests/consumers/test_event_bytes.py decodes
every builder's output with `schemas.decode_result` and compares it to the model), so
readers validate them as usual. Inputs come from the engine and from already-validated
requests, so they need no checking of their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from inflight.schemas.base import SCHEMA_VERSION
from inflight.schemas.embeddings import encode_vector

if TYPE_CHECKING:
    from inflight.engine.outputs import RequestOutput


def token_event(request_id: str, attempt: str, index: int, start: int, token_ids: list[int],
                text: str, logprobs: list | None = None) -> bytes:
    body = {"type": "token", "schema_version": SCHEMA_VERSION, "request_id": request_id,
            "attempt": attempt, "index": index, "start": start, "token_ids": token_ids,
            "text": text}
    if logprobs is not None:
        body["logprobs"] = logprobs
    return orjson.dumps(body)


def status_event(request_id: str, attempt: str, worker: str, at: float) -> bytes:
    return orjson.dumps({"type": "status", "schema_version": SCHEMA_VERSION,
                         "request_id": request_id, "attempt": attempt, "status": "running",
                         "worker": worker, "at": at})


def final_event(request_id: str, attempt: str, out: RequestOutput, *, worker: str,
                batch_id: str | None, submitted_at: float | None, queued_at: float,
                logprobs: dict | None = None, prompt_logprobs: list | None = None,
                tool_calls: list | None = None, model: str | None = None,
                tenant: str | None = None) -> bytes:
    """The FinalEvent of a finished engine output (`out`: engine RequestOutput); the
    logprobs, when the request asked, already in OpenAI's shapes (engine_bridge.LogprobShaper)."""
    prompt = out.num_prompt_tokens
    event = {
        "type": "final", "schema_version": SCHEMA_VERSION, "request_id": request_id,
        "attempt": attempt, "text": out.text, "token_ids": out.token_ids,
        "finish_reason": out.finish_reason,
        "usage": {"prompt_tokens": prompt, "completion_tokens": len(out.token_ids),
                  "cached_prompt_tokens": min(out.num_cached_tokens, prompt)},
        "timings": {"submitted_at": submitted_at, "queued_at": queued_at,
                    "scheduled_at": None, "first_token_at": out.first_token_time,
                    "finished_at": out.finish_time},
        "worker": worker, "batch_id": batch_id}
    if model is not None:
        event["model"] = model
    if logprobs is not None:
        event["logprobs"] = logprobs
    if prompt_logprobs is not None:
        event["prompt_logprobs"] = prompt_logprobs
    if tool_calls is not None:
        event["tool_calls"] = tool_calls
    if getattr(out, "stop_reason", None) is not None:
        event["stop_reason"] = out.stop_reason
    if tenant is not None:
        event["tenant"] = tenant
    vector = getattr(out, "embedding", None)  # an EmbeddingOutput's float32 vector
    if vector is not None:
        event["embedding"] = encode_vector(vector)
    return orjson.dumps(event)


def abort_event(request_id: str, attempt: str, *, worker: str, batch_id: str | None,
                submitted_at: float | None, queued_at: float, now: float,
                model: str | None = None, finish_reason: str = "abort",
                tenant: str | None = None) -> bytes:
    """The FinalEvent of a request cancelled (or expired) before it ran."""
    event = {
        "type": "final", "schema_version": SCHEMA_VERSION, "request_id": request_id,
        "attempt": attempt, "text": "", "token_ids": [], "finish_reason": finish_reason,
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "cached_prompt_tokens": 0},
        "timings": {"submitted_at": submitted_at, "queued_at": queued_at, "scheduled_at": None,
                    "first_token_at": None, "finished_at": now},
        "worker": worker, "batch_id": batch_id}
    if model is not None:
        event["model"] = model
    if tenant is not None:
        event["tenant"] = tenant
    return orjson.dumps(event)


def error_event(request_id: str | None, attempt: str | None, code: str, message: str, *,
                field: str | None, worker: str, batch_id: str | None,
                model: str | None = None, tenant: str | None = None) -> bytes:
    event = {"type": "error", "schema_version": SCHEMA_VERSION, "request_id": request_id,
             "attempt": attempt, "code": code, "message": message, "field": field,
             "final": True, "worker": worker, "batch_id": batch_id}
    if model is not None:
        event["model"] = model
    if tenant is not None:
        event["tenant"] = tenant
    return orjson.dumps(event)

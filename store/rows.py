"""Wire events → `requests` rows (plain dicts of column values) for `Store.upsert_requests`."""

from __future__ import annotations

import base64
from datetime import datetime, timezone
from typing import Any

import orjson

from inflight.schemas.events import (ERR_CANCELLED, ERR_EXPIRED, ERR_STORE_REJECTED, ErrorEvent,
                            FinalEvent)
from inflight.schemas.requests import InferenceRequest
from inflight.store.models import CANCELLED, COMPLETED, EXPIRED, FAILED, QUEUED, RUNNING

# engine finish reason -> final request status
FINISH_TO_STATUS = {"stop": COMPLETED, "length": COMPLETED, "abort": CANCELLED, "error": FAILED,
                    "expired": EXPIRED}
_ERROR_CODE_TO_STATUS = {ERR_CANCELLED: CANCELLED, ERR_EXPIRED: EXPIRED}


def _ts(epoch: float | None) -> datetime | None:
    """Epoch seconds as an aware datetime; None when unknown or out of datetime's range (a
    client may send any `submitted_at`: it must not make its row unbuildable)."""
    if epoch is None:
        return None
    try:
        return datetime.fromtimestamp(epoch, timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None


def queued_row(req: InferenceRequest, model: str | None = None) -> dict[str, Any]:
    """The `queued` row of a request; `model`: its model's name when the request names
    none (the default model, as the router resolved it)."""
    params = req.params.to_dict()
    if req.tools is not None:  # kept with the parameters they turn into
        params["tools"] = [t.model_dump(mode="json", exclude_none=True) for t in req.tools]
        params["tool_choice"] = (req.tool_choice if isinstance(req.tool_choice, str) or
                                 req.tool_choice is None else req.tool_choice.model_dump(mode="json"))
    return {"id": req.request_id, "batch_id": req.batch_id, "status": QUEUED,
            "model": req.model or model, "priority": req.priority, "prompt": req.prompt_json(),
            "params": params, "tenant": req.tenant,
            "created_at": _ts(req.submitted_at)}


def running_row(request_id: str, *, worker: str | None = None, started_at: float | None = None,
                batch_id: str | None = None) -> dict[str, Any]:
    """A worker admitted the request at `started_at`: one attempt (the upsert counts an
    admission later than the last one counted as a new attempt, a replay as none)."""
    at = _ts(started_at)
    return {"id": request_id, "status": RUNNING, "worker": worker,
            "attempts": 1 if at is not None else None, "attempt_started_at": at,
            "started_at": at, "batch_id": batch_id}


def final_row(event: FinalEvent) -> dict[str, Any]:
    t = event.timings
    return {"id": event.request_id, "batch_id": event.batch_id,
            "status": FINISH_TO_STATUS[event.finish_reason], "output": event.text,
            "output_token_ids": list(event.token_ids), "finish_reason": event.finish_reason,
            "usage": event.usage.model_dump(mode="json"), "tenant": event.tenant,
            "tokens": event.usage.prompt_tokens + event.usage.completion_tokens,
            "timings": t.model_dump(mode="json"), "worker": event.worker, "model": event.model,
            "started_at": _ts(t.scheduled_at if t.scheduled_at is not None else t.queued_at),
            "finished_at": _ts(t.finished_at), "logprobs": logprobs_column(event),
            "tool_calls": (None if event.tool_calls is None
                           else [c.model_dump(mode="json") for c in event.tool_calls]),
            "embedding": None if event.embedding is None else base64.b64decode(event.embedding)}


def logprobs_column(event: FinalEvent) -> dict[str, Any] | None:
    """`requests.logprobs`: OpenAI's choice.logprobs object ({"content": [...]}) of the
    output, plus "prompt_logprobs" when the request asked for those; None when neither."""
    if event.logprobs is None and event.prompt_logprobs is None:
        return None
    col = event.logprobs.model_dump(mode="json") if event.logprobs is not None else {"content": None}
    if event.prompt_logprobs is not None:
        col["prompt_logprobs"] = [None if e is None else e.model_dump(mode="json")
                                  for e in event.prompt_logprobs]
    return col


def error_row(event: ErrorEvent, *, now: float | None = None) -> dict[str, Any]:
    if event.request_id is None:
        raise ValueError("an ErrorEvent without request_id has no row; it lives in the DLQ only")
    status = _ERROR_CODE_TO_STATUS.get(event.code, FAILED)
    return {"id": event.request_id, "batch_id": event.batch_id, "status": status,
            "finish_reason": "error" if status == FAILED else "abort", "error": event.message,
            "error_code": event.code, "worker": event.worker, "model": event.model,
            "tenant": event.tenant,
            "finished_at": _ts(now) if now is not None else datetime.now(timezone.utc)}


def stand_in_rows(row: dict[str, Any], reason: str) -> list[dict[str, Any]]:
    """Smaller rows to try, in order, when the database refuses `row` for its content.

    NOTE: a request must still end with exactly one final row. A refused final row
    becomes an error row that says why (a completed one becomes `failed`: its output is not
    stored); cancelled/expired/failed keep their status. A refused queued/running row keeps
    only its identity (the final row comes later and fills in). The first stand-in keeps the
    small describing columns, the last only id and status, in case one of those was the
    refused value."""
    status = row["status"]
    if status in (QUEUED, RUNNING):
        identity = ("id", "status", "batch_id", "priority", "custom_id", "owner", "created_at",
                    "model", "tenant", "tokens")
        return [{k: row.get(k) for k in identity},
                {"id": row["id"], "status": status}]
    final_status = FAILED if status == COMPLETED else status
    what = "its output was produced but is not stored" if status == COMPLETED else "its result"
    message = (f"the database refused this request's {status} row, so {what}: {reason}. "
               "The recorder's log has the details; the request is not retried")
    bare = {"id": row["id"], "status": final_status,
            "finish_reason": "error" if final_status == FAILED else row.get("finish_reason"),
            "error": message, "error_code": ERR_STORE_REJECTED,
            "finished_at": row.get("finished_at") or datetime.now(timezone.utc)}
    keep = ("batch_id", "worker", "usage", "timings", "started_at", "model", "tenant", "tokens")
    return [bare | {k: row.get(k) for k in keep}, bare]


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, (dict, list)) and not _may_hold_nul(value):
        return value
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _may_hold_nul(value: Any) -> bool:
    """NOTE: one C-speed serialization instead of a Python walk of every prompt token id
    and usage field (the walk was a visible share of the recorder's CPU); a false "maybe"
    only costs the walk."""
    try:
        return b"\\u0000" in orjson.dumps(value)
    except (orjson.JSONEncodeError, TypeError):
        return True


def clean_row(row: dict[str, Any]) -> dict[str, Any]:
    """NUL characters (a model can emit them) are not storable in Postgres text/JSONB:
    they become U+FFFD in text; `output_token_ids` keeps the exact output, and `output`
    the exact text (its column type escapes NUL: store/models.ExactText)."""
    return {k: (v if k in _EXACT else _clean(v)) for k, v in row.items()}


_EXACT = frozenset({"output_token_ids", "output"})

"""Server-Sent Events framing, and the final event of a request rebuilt from its row."""

from __future__ import annotations

from typing import Any

from store import FAILED, FINAL_STATUSES


def sse(event: str | None, data: bytes) -> bytes:
    """One SSE frame. `data` is compact JSON (no newlines), so one `data:` line holds it."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + data + b"\n\n"


def stored_final_event(row: Any) -> dict[str, Any]:
    """The wire-shaped final event (`final`, or `error` for failed/cancelled/expired rows
    that carry an error) of a finished request, from its store row."""
    assert row.status in FINAL_STATUSES
    if row.error_code is not None or (row.status == FAILED and row.output is None):
        return {"type": "error", "request_id": row.id, "code": row.error_code or "failed",
                "message": row.error or row.status, "worker": row.worker,
                "batch_id": row.batch_id}
    return {"type": "final", "request_id": row.id, "text": row.output or "",
            "token_ids": row.output_token_ids or [], "finish_reason": row.finish_reason,
            "usage": row.usage or {}, "timings": row.timings or {}, "worker": row.worker,
            "batch_id": row.batch_id}

"""Server-Sent Events framing, and the final event of a request rebuilt from its row."""

from __future__ import annotations

from typing import Any

from inflight.store import FAILED, FINAL_STATUSES


def sse(event: str | None, data: bytes) -> bytes:
    """One SSE frame. `data` is compact JSON (no newlines), so one `data:` line holds it."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + data + b"\n\n"


def stored_events(row: Any) -> list[dict[str, Any]]:
    """A finished request's stream, rebuilt from its store row, as Client.stream gives it
    to a reader that comes late: one `token` delta with the whole output (so text built
    from deltas is complete), then the `final` event; or just the `error` event for
    failed/cancelled/expired rows that carry an error."""
    assert row.status in FINAL_STATUSES
    if row.error_code is not None or (row.status == FAILED and row.output is None):
        return [{"type": "error", "request_id": row.id, "code": row.error_code or "failed",
                 "message": row.error or row.status, "worker": row.worker,
                 "batch_id": row.batch_id}]
    text, ids = row.output or "", row.output_token_ids or []
    final = {"type": "final", "request_id": row.id, "text": text, "token_ids": ids,
             "finish_reason": row.finish_reason, "usage": row.usage or {},
             "timings": row.timings or {}, "worker": row.worker, "batch_id": row.batch_id}
    if not text and not ids:
        return [final]
    return [{"type": "token", "request_id": row.id, "index": 0, "start": 0, "token_ids": ids,
             "text": text}, final]

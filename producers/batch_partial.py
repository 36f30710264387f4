"""Results while a batch runs: the lines of its finished requests so far, in the order
they were recorded, resumable by a cursor (`inflight batch results BATCH --partial`,
`GET /v1/batches/{id}/results?after=CURSOR`).

Each line is exactly the line the final output (or error) file will hold for that request
(producers.batch_output: OpenAI output/error lines, Anthropic result lines). A cursor
names the last line read: `(updated_at, request id)` of its row, so a resumed read
returns only rows recorded after it.

NOTE (settle window): rows are read only once they were written INFLIGHT_BATCH_PARTIAL_
SETTLE_S ago (none while the batch has ended): a recorder transaction stamped earlier but
committed later than a read would otherwise fall behind the cursor and never be seen.
A row recorded twice (a duplicate final after a redelivery) may come twice: de-duplicate
by custom_id.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import orjson

from inflight.schemas.anthropic_batch import MESSAGES_URL
from inflight.schemas.batch import CHAT_URL
from inflight.schemas.errors import SchemaError
from inflight.store import BatchRow, Store
from inflight.store.models import utcnow
from inflight.store.partial_queries import finished_page

from inflight.producers.batch_output import anthropic_line, openai_line

SETTLE_S = 2.0
PAGE = 1000


def encode_cursor(at: datetime, rid: str) -> str:
    micros = int(at.timestamp() * 1_000_000)
    return base64.urlsafe_b64encode(f"{micros}:{rid}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        micros, _, rid = raw.partition(":")
        at = datetime.fromtimestamp(int(micros) / 1_000_000, timezone.utc)
        if not rid:
            raise ValueError("no id")
    except (ValueError, UnicodeDecodeError):
        raise SchemaError(f"after: {cursor!r:.80} is not a cursor this API gave out (the "
                          "`next_after` of an earlier read)", field="after") from None
    return at, rid


@dataclass
class Page:
    lines: list[bytes]
    next_after: str | None      # the cursor after the last line (None: no line read)
    has_more: bool              # more finished lines are there to read now


def read_page(store: Store, batch: BatchRow, *, after: str | None, default_model: str,
              limit: int = PAGE, settle_s: float = SETTLE_S) -> Page:
    cursor = decode_cursor(after) if after else None
    before = None if batch.is_final else utcnow() - timedelta(seconds=settle_s)
    rows = finished_page(store, batch.id, after=cursor, written_before=before, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    lines = [orjson.dumps(_line(batch, r, default_model)) for r in rows]
    nxt = encode_cursor(rows[-1]["updated_at"], rows[-1]["id"]) if rows else after
    return Page(lines, nxt, more)


def _line(batch: BatchRow, row: dict, default_model: str) -> dict:
    cid = row.get("custom_id") or row["id"]
    model = row.get("model") or default_model
    tools = bool(row.get("tool_calls"))
    if batch.endpoint == MESSAGES_URL:
        return anthropic_line(cid, row["id"], row, model=model, batch_status=batch.status,
                              tools=tools)
    return openai_line(cid, row["id"], row, endpoint=batch.endpoint or CHAT_URL, model=model,
                       batch_status=batch.status, tools=tools)[0]

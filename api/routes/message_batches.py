"""Anthropic Message Batches over our batch jobs (endpoint /v1/messages).

    POST /v1/messages/batches                 {"requests": [{custom_id, params}, ...]}
    GET  /v1/messages/batches[?after_id=&limit=]
    GET  /v1/messages/batches/{id}
    POST /v1/messages/batches/{id}/cancel
    GET  /v1/messages/batches/{id}/results    JSONL, once processing ended

The requests arrive inline; they are read as the body arrives, one request at a time
(api/message_body.py), and written as one JSONL input file (one `{custom_id, params}`
line each, the same caps as an uploaded file), then run as a batch with endpoint
/v1/messages. Errors here use Anthropic's shape (api/errors.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Annotated, Any

from anyio import from_thread, to_thread
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response, StreamingResponse

from inflight.api.deps import Caller, Ctx
from inflight.api.errors import APIError
from inflight.api.message_body import message_batch_lines
from inflight.api.models.batches import (CreateMessageBatch, MessageBatchList, MessageBatchObject)
from inflight.api.models.errors import ANTHROPIC_ERRORS
from inflight.api.responses import json_response
from inflight.api.routes.batches import owned_batch, start
from inflight.api.routes.files import stream_file
from inflight.api.routing import ApiRoute
from inflight.producers import batch_jobs
from inflight.producers.batch_lines import model_lookup
from inflight.schemas.anthropic_batch import MESSAGES_URL
from inflight.store import new_file_id

router = APIRouter(route_class=ApiRoute, prefix="/v1/messages/batches", tags=["anthropic"],
                   responses=ANTHROPIC_ERRORS)
BatchId = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$",
                              description="the message batch id (msgbatch_...)")]
ENDPOINTS = (MESSAGES_URL,)
WINDOW = "24h"  # Anthropic's fixed processing window


def _object(ctx: Ctx, row: Any) -> dict[str, Any]:
    # NOTE: never built from the request's Host header (a client could make the service
    # hand out a link to a host of its choosing, and behind a TLS proxy it is the wrong
    # scheme and host): relative to the API's root, or under INFLIGHT_API_PUBLIC_URL
    path = f"{router.prefix}/{row.id}/results"
    base = ctx.settings.api_public_url
    return batch_jobs.anthropic_batch_object(
        row, results_url=base.rstrip("/") + path if base else path)


@router.post("", response_model=MessageBatchObject, summary="Create a Message Batch",
             openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                 "schema": CreateMessageBatch.model_json_schema(
                     ref_template="#/components/schemas/{model}")}}}})
async def create_message_batch(request: Request, ctx: Ctx, caller: Caller) -> Response:
    # NOTE: read as it arrives, not as a pydantic body: up to INFLIGHT_API_MAX_UPLOAD_BYTES
    # of requests, turned into lines one request at a time (api/message_body.py) and
    # stored as they come, so memory holds one request, never the body
    bid, fid = "msgbatch_" + uuid.uuid4().hex, new_file_id()
    body = request.stream()

    async def next_piece() -> bytes | None:
        try:
            return await body.__anext__()
        except StopAsyncIteration:
            return None

    def pieces() -> Iterator[bytes]:
        while (piece := from_thread.run(next_piece)) is not None:
            yield piece

    def store_it() -> Any:
        lines = message_batch_lines(pieces(), batch_id=bid, settings=ctx.settings,
                                    context=ctx.models.default.max_model_len,
                                    models=model_lookup(ctx.models.client))
        try:
            ctx.store.create_file(lines, purpose="batch", filename=f"{bid}_requests.jsonl",
                                  owner=caller.owner, file_id=fid)
        except BaseException:
            ctx.store.delete_file(fid)  # a refused request refuses the batch: nothing stays
            raise
        return batch_jobs.create_batch(ctx.store, input_file_id=fid, endpoint=MESSAGES_URL,
                                       completion_window=WINDOW, owner=caller.owner,
                                       batch_id=bid)

    # its own thread, not a database slot: it holds it for as long as the body streams
    row = await to_thread.run_sync(store_it)
    await start(ctx, row.id)
    return json_response(_object(ctx, row))


@router.get("", response_model=MessageBatchList, summary="List your Message Batches")
async def list_message_batches(ctx: Ctx, caller: Caller,
                               after_id: Annotated[str | None, Query(max_length=128)] = None,
                               before_id: Annotated[str | None, Query(max_length=128)] = None,
                               limit: Annotated[int, Query(ge=1, le=1000)] = 20) -> Response:
    if before_id is not None:
        raise APIError(400, "before_id is not supported; page forward with after_id",
                       param="before_id")
    if after_id is not None:
        try:
            await owned_batch(ctx, caller, after_id, ENDPOINTS, "message batch")
        except APIError:
            raise APIError(404, f"after_id: no message batch {after_id!r:.140} to page "
                                "from; list again without `after_id`", param="after_id",
                           code="not_found") from None
    rows = await ctx.db(lambda: ctx.store.list_batches(
        owner=caller.owner, after=after_id, limit=limit + 1, endpoint=ENDPOINTS))
    page = [_object(ctx, r) for r in rows[:limit]]
    return json_response({"data": page, "has_more": len(rows) > limit,
                          "first_id": page[0]["id"] if page else None,
                          "last_id": page[-1]["id"] if page else None})


@router.get("/{batch_id}", response_model=MessageBatchObject, summary="A Message Batch")
async def retrieve_message_batch(batch_id: BatchId, ctx: Ctx, caller: Caller) -> Response:
    row = await owned_batch(ctx, caller, batch_id, ENDPOINTS, "message batch")
    return json_response(_object(ctx, row))


@router.post("/{batch_id}/cancel", response_model=MessageBatchObject,
             summary="Cancel a Message Batch")
async def cancel_message_batch(batch_id: BatchId, ctx: Ctx, caller: Caller) -> Response:
    await owned_batch(ctx, caller, batch_id, ENDPOINTS, "message batch")
    row = await to_thread.run_sync(batch_jobs.cancel_batch, ctx.store, ctx.client, batch_id)
    return json_response(_object(ctx, row))


@router.get("/{batch_id}/results", name="message_batch_results",
            response_class=StreamingResponse,
            responses={200: {"content": {"application/binary": {}},
                             "description": "one JSON result per line (JSONL)"},
                       409: {"description": "processing has not ended yet"}},
            summary="A Message Batch's results (JSONL)")
async def message_batch_results(batch_id: BatchId, ctx: Ctx, caller: Caller) -> Response:
    row = await owned_batch(ctx, caller, batch_id, ENDPOINTS, "message batch")
    if not row.is_final:
        raise APIError(409, f"message batch {batch_id} has not ended yet ({row.status}); "
                            "results come once processing_status is ended",
                       code="not_ended")
    if not row.output_file_id:
        why = "; ".join(e.get("message", "") for e in (row.errors or [])[:3]) or row.status
        raise APIError(409, f"message batch {batch_id} ended without results ({row.status}): "
                            f"{why}", code="no_results")
    return StreamingResponse(stream_file(ctx, row.output_file_id),
                             media_type="application/binary")

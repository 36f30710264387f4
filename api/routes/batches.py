"""OpenAI Batches over our batch jobs (producers.batch_jobs; Celery does the slow work).

    POST /v1/batches                   {input_file_id, endpoint, completion_window, metadata}
    GET  /v1/batches[?after=&limit=]   newest first, OpenAI's cursor paging
    GET  /v1/batches/{batch_id}
    POST /v1/batches/{batch_id}/cancel
    GET  /v1/batches/{batch_id}/results[?after=&limit=]   finished lines so far (JSONL)

Creating files the batch row under the caller, then sends the validate-and-enqueue task;
the batch moves on its own (validating -> in_progress -> finalizing -> completed) and its
output/error files are read at GET /v1/files/{id}/content.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from anyio import to_thread
from fastapi import APIRouter, Path, Query
from fastapi.responses import Response, StreamingResponse

from inflight.api.context import ApiContext
from inflight.api.deps import Caller, Ctx, owns
from inflight.api.errors import APIError, not_found
from inflight.api.models.batches import OPENAI_ENDPOINTS, BatchList, BatchObject, CreateBatch
from inflight.api.models.errors import OPENAI_ERRORS
from inflight.api.responses import json_response
from inflight.api.routes.files import owned_file
from inflight.api.routing import ApiRoute
from inflight.producers import batch_jobs
from inflight.producers.celery_app import send_enqueue
from inflight.schemas.base import ID_RE

router = APIRouter(route_class=ApiRoute, prefix="/v1/batches", tags=["batches"],
                   responses=OPENAI_ERRORS)
BatchId = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$",
                              description="the batch id (batch_...)")]


async def owned_batch(ctx: ApiContext, caller: Caller, batch_id: str,
                      endpoints: tuple[str, ...], what: str = "batch") -> Any:
    """The caller's batch of one of these endpoints (an Anthropic batch is not an OpenAI
    one and the other way round), else 404."""
    # NOTE: an id no batch can have is not looked up (Postgres refuses a NUL in a query)
    row = await ctx.db(ctx.store.get_batch, batch_id) if ID_RE.match(batch_id) else None
    if row is None or not owns(caller, row.owner) or row.endpoint not in endpoints:
        raise not_found(what, batch_id)
    return row


async def start(ctx: ApiContext, batch_id: str) -> None:
    """Hand a new batch to the Celery workers (`inflight jobs`)."""
    await to_thread.run_sync(send_enqueue, ctx.client.celery, batch_id)
    ctx.metrics.inc("batches_created")


@router.post("", response_model=BatchObject, summary="Create a batch from an uploaded file")
async def create_batch(body: CreateBatch, ctx: Ctx, caller: Caller) -> Response:
    try:
        await owned_file(ctx, caller, body.input_file_id)
    except APIError:
        raise APIError(404, f"No file found with id {body.input_file_id!r}.",
                       param="input_file_id", code="not_found") from None
    row = await ctx.db(lambda: batch_jobs.create_batch(
        ctx.store, input_file_id=body.input_file_id, endpoint=body.endpoint,
        completion_window=body.completion_window, metadata=body.metadata,
        owner=caller.owner,
        output_expires_after=body.output_expires_after.model_dump()
        if body.output_expires_after else None))
    await start(ctx, row.id)
    return json_response(batch_jobs.batch_object(row))


@router.get("", response_model=BatchList, summary="List your batches, newest first")
async def list_batches(ctx: Ctx, caller: Caller,
                       after: Annotated[str | None, Query(max_length=128)] = None,
                       limit: Annotated[int, Query(ge=1, le=100)] = 20) -> Response:
    if after is not None:
        try:
            await owned_batch(ctx, caller, after, OPENAI_ENDPOINTS)
        except APIError:
            raise APIError(404, f"after: no batch {after!r:.140} to page from; list again "
                                "without `after`", param="after", code="not_found") from None
    rows = await ctx.db(lambda: ctx.store.list_batches(
        owner=caller.owner, after=after, limit=limit + 1, endpoint=OPENAI_ENDPOINTS))
    page = [batch_jobs.batch_object(r) for r in rows[:limit]]
    return json_response({"object": "list", "data": page,
                          "first_id": page[0]["id"] if page else None,
                          "last_id": page[-1]["id"] if page else None,
                          "has_more": len(rows) > limit})


@router.get("/{batch_id}", response_model=BatchObject, summary="A batch")
async def retrieve_batch(batch_id: BatchId, ctx: Ctx, caller: Caller) -> Response:
    row = await owned_batch(ctx, caller, batch_id, OPENAI_ENDPOINTS)
    if not row.is_final and row.in_progress_at is not None:
        # request_counts exact at every moment: counted now (one GROUP BY on the index)
        row = await ctx.db(batch_jobs.live_counts, ctx.store, row)
    return json_response(batch_jobs.batch_object(row))


@router.get("/{batch_id}/results", summary="The finished lines so far (JSONL), resumable",
            response_class=StreamingResponse,
            responses={200: {"content": {"application/jsonl": {}},
                             "description": "one output/error line per finished request; "
                                            "headers x-next-after (the cursor to resume "
                                            "from) and x-has-more"}})
async def batch_results(batch_id: BatchId, ctx: Ctx, caller: Caller,
                        after: Annotated[str | None, Query(max_length=600)] = None,
                        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
                        format: Annotated[Literal["jsonl", "parquet"], Query()] = "jsonl",
                        ) -> Response:
    """Lines of the requests finished so far, in the order they were recorded (each the
    line the output or error file will hold); read again with `after` = x-next-after.
    `format=parquet`: every request of the batch as one Parquet table (the input table's
    columns for a Parquet batch, plus status, text, finish_reason, usage and error)."""
    from inflight.producers.batch_partial import read_page

    row = await owned_batch(ctx, caller, batch_id, OPENAI_ENDPOINTS)
    if format == "parquet":
        return await _parquet_results(ctx, row)
    page = await ctx.db(lambda: read_page(ctx.store, row, after=after, limit=limit,
                                          default_model=ctx.settings.served_model_id()))
    headers = {"x-has-more": "true" if page.has_more else "false",
               "x-batch-status": row.status}
    if page.next_after:
        headers["x-next-after"] = page.next_after
    return StreamingResponse(iter([b"".join(x + b"\n" for x in page.lines)]),
                             media_type="application/jsonl", headers=headers)


async def _parquet_results(ctx: ApiContext, row: Any) -> Response:
    """Written a row group at a time to a temporary file, then streamed from it."""
    import tempfile

    from inflight.producers.batch_parquet import write_results

    tmp = tempfile.TemporaryFile(prefix="inflight-results-")
    try:
        await ctx.db(write_results, ctx.store, row, tmp)
        tmp.seek(0)
    except BaseException:
        tmp.close()
        raise

    def chunks():
        with tmp:
            while piece := tmp.read(1 << 20):
                yield piece

    return StreamingResponse(chunks(), media_type="application/vnd.apache.parquet", headers={
        "content-disposition": f'attachment; filename="{row.id}_results.parquet"',
        "x-batch-status": row.status})


@router.post("/{batch_id}/cancel", response_model=BatchObject,
             responses={409: {"description": "the batch already ended otherwise"}},
             summary="Cancel a batch (cancelling, then cancelled with partial results)")
async def cancel_batch(batch_id: BatchId, ctx: Ctx, caller: Caller) -> Response:
    await owned_batch(ctx, caller, batch_id, OPENAI_ENDPOINTS)
    row = await to_thread.run_sync(batch_jobs.cancel_batch, ctx.store, ctx.client, batch_id)
    return json_response(batch_jobs.batch_object(row))

"""Single requests: submit, poll, stream, cancel.

    POST   /v1/requests              -> 202 request object (status "queued")
    GET    /v1/requests/{id}         -> request object; 404 unknown (or another key's)
    GET    /v1/requests/{id}/events  -> Server-Sent Events: token deltas, then the final
    DELETE /v1/requests/{id}         -> 202 cancel sent (200 if it had already finished)

Submitting inserts the `queued` row (filed under the caller) before publishing, so a poll
right after the 202 finds it; if the broker then fails, the row is removed and the client
gets a 503 it may retry with the same request_id. A repeat of an accepted request_id
answers the first request's state and publishes nothing (the first body is what runs).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

import orjson
from anyio import to_thread
from fastapi import APIRouter, Path
from fastapi.responses import Response, StreamingResponse

from inflight.api.deps import Caller, Ctx, owns
from inflight.api.errors import APIError, not_found
from inflight.api.follow import for_owner, routed
from inflight.api.rate_limits import admit
from inflight.api.models.errors import OPENAI_ERRORS, SUBMIT_ERRORS
from inflight.api.models.requests import RequestObject, SubmitRequest, queued_object, request_object
from inflight.api.responses import json_response
from inflight.api.routing import ApiRoute
from inflight.api.sse import sse, stored_events
from inflight.api.streams import SSE_HEADERS, SSE_KEEPALIVE, ApiStream, StreamResponse
from inflight.producers import RequestNotFound
from inflight.producers.requests_client import STREAM_CLOCK_SLACK_S, STREAM_LOOKBACK_S
from inflight.schemas import PRIORITY_BATCH
from inflight.schemas.errors import InflightError
from inflight.store import FINAL_STATUSES, queued_row
from inflight.store.owner_queries import release_request

router = APIRouter(route_class=ApiRoute, prefix="/v1/requests", tags=["requests"],
                   responses=OPENAI_ERRORS)
PathId = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$",
                             description="the request_id")]


@router.post("", status_code=202, response_model=RequestObject, responses=SUBMIT_ERRORS,
             summary="Submit one inference request")
async def submit(body: SubmitRequest, ctx: Ctx, caller: Caller) -> Response:
    rid = body.request_id or uuid.uuid4().hex
    route = ctx.models.resolve(body.model)
    if body.reply_to is not None:  # by its name; the worker checks that it exists
        why = ctx.reply_names.refusal(body.reply_to)
        if why is not None:
            raise APIError(400, why, param="reply_to", code="reply_to_refused")
    req = for_owner(routed(body.to_wire(rid, ctx.settings.max_prompt_chars), route), caller.owner)
    row = queued_row(req, route.name)
    row["tokens"] = admit(req)  # 429 when over the caller's limits (api/rate_limits.py)
    existing = await ctx.claims.claim(row, caller.owner)
    if existing is not None:
        if caller.owner != existing.owner:  # another key's id (or a Kafka-only one)
            raise APIError(409, f"request_id {rid!r} is already in use; choose another",
                           param="request_id", code="request_id_conflict")
        ctx.metrics.inc("duplicates")  # the first one is what runs; nothing is sent again
        return json_response(request_object(existing), 202)
    try:
        await ctx.publish(req, route.topic(req.priority >= PRIORITY_BATCH))
    except BaseException:
        await ctx.db(release_request, ctx.store, rid, caller.owner)
        raise
    ctx.metrics.inc("submitted")
    ctx.metrics.submitted(route.name, "submitted")
    return json_response(queued_object(req, route.name), 202)


async def _owned_row(ctx: Ctx, caller: Caller, request_id: str) -> Any:
    row = await ctx.views.view(request_id)  # grouped with concurrent polls
    if row is None or not owns(caller, row.owner):
        raise not_found("request", request_id)
    return row


@router.get("/{request_id}", response_model=RequestObject, summary="Poll a request by id")
async def get_request(request_id: PathId, ctx: Ctx, caller: Caller) -> Response:
    cached = ctx.finals.get(request_id)
    if cached is not None:
        if owns(caller, cached[0]):
            return json_response(cached[1])
        # NOTE: another owner's id costs the same lookup as an unknown one, so the time of
        # the 404 does not tell that the id exists
        await ctx.views.view(request_id)
        raise not_found("request", request_id)
    row = await _owned_row(ctx, caller, request_id)
    body = orjson.dumps(request_object(row))
    if row.status in FINAL_STATUSES:
        ctx.finals.put(request_id, row.owner, body)
    return json_response(body)


@router.delete("/{request_id}", response_model=RequestObject, status_code=202,
               responses={200: {"model": RequestObject, "description": "already finished"}},
               summary="Cancel a request")
async def cancel_request(request_id: PathId, ctx: Ctx, caller: Caller) -> Response:
    row = await _owned_row(ctx, caller, request_id)
    if row.status in FINAL_STATUSES:
        return json_response(request_object(row), 200)
    await to_thread.run_sync(ctx.client.cancel, request_id)
    ctx.metrics.inc("cancels")
    return json_response(request_object(row), 202)


@router.get("/{request_id}/events", summary="Stream a request's events (SSE)",
            response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}},
                             "description": "`event: token` deltas, then one `event: final` "
                                            "or `event: error`; data is the event's JSON. A "
                                            "delta with index 0 after others starts the text "
                                            "over (the request was redone on another worker)"}})
async def request_events(request_id: PathId, ctx: Ctx, caller: Caller) -> StreamingResponse:
    row = await _owned_row(ctx, caller, request_id)
    if row.status in FINAL_STATUSES:
        # finished: the store has the whole answer (Kafka may have dropped the events)
        return StreamingResponse(_stored(stored_events(row)), media_type="text/event-stream",
                                 headers=SSE_HEADERS)
    # NOTE: the row's time is the filing API process's clock: the reader starts early
    since = (row.created_at.timestamp() - STREAM_CLOCK_SLACK_S if row.created_at is not None
             else time.time() - STREAM_LOOKBACK_S)
    stream = ctx.streams.open(request_id, since)
    return StreamResponse(_events(stream), stream)


async def _stored(events: list[dict[str, Any]]) -> AsyncIterator[bytes]:
    for event in events:
        yield sse(event["type"], orjson.dumps(event))


async def _events(stream: ApiStream) -> AsyncIterator[bytes]:
    request_id = stream.request_id
    yield SSE_KEEPALIVE  # a first byte at once; another every INFLIGHT_API_KEEPALIVE_S idle
    try:
        while not stream.finished:
            event = await stream.next_or_idle()
            if event is None:
                yield SSE_KEEPALIVE
                continue
            yield sse(event.type, orjson.dumps(event.model_dump(mode="json")))
    except RequestNotFound as exc:
        yield sse("error", orjson.dumps({"type": "error", "request_id": request_id,
                                         "code": "timeout", "message": str(exc)}))
    except InflightError as exc:
        yield sse("error", orjson.dumps({"type": "error", "request_id": request_id,
                                         "code": "unavailable", "message": str(exc)}))

"""Webhook endpoints of the caller: batch events, signed (Standard Webhooks), delivered by
the jobs worker (producers.webhooks; never from an API request).

    POST   /v1/webhooks                     {"url", "events"?} -> the endpoint + its secret (once)
    GET    /v1/webhooks                     the caller's endpoints (status, disabled_reason)
    GET    /v1/webhooks/{id}
    DELETE /v1/webhooks/{id}                -> {id, deleted: true}
    GET    /v1/webhooks/{id}/attempts       delivery attempts, newest first
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from inflight.api.context import ApiContext
from inflight.api.deps import Caller, Ctx, owns
from inflight.api.errors import not_found
from inflight.api.models.errors import OPENAI_ERRORS
from inflight.api.responses import json_response
from inflight.api.routing import ApiRoute
from inflight.producers import webhooks
from inflight.store import webhooks as q

router = APIRouter(route_class=ApiRoute, prefix="/v1/webhooks", tags=["webhooks"],
                   responses=OPENAI_ERRORS)
EndpointId = Annotated[str, Path(pattern=r"^we_[0-9a-f]{1,64}$",
                                 description="the webhook endpoint id (we_...)")]
EventType = Literal["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]


class CreateWebhook(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: Annotated[str, Field(min_length=1, max_length=2048)]
    events: Annotated[list[EventType] | None, Field(min_length=1, max_length=4)] = None


class WebhookObject(BaseModel):
    id: str
    object: Literal["webhook_endpoint"] = "webhook_endpoint"
    url: str
    events: list[str]
    status: Literal["enabled", "disabled"]
    disabled_reason: str | None
    created_at: int
    secret: str | None = Field(None, description="whsec_...: shown only when created")


async def owned_endpoint(ctx: ApiContext, caller: Caller, endpoint_id: str) -> Any:
    row = await ctx.db(q.get_endpoint, ctx.store, endpoint_id)
    if row is None or not owns(caller, row.owner):
        raise not_found("webhook endpoint", endpoint_id)
    return row


@router.post("", response_model=WebhookObject,
             summary="Register a webhook endpoint (its signing secret is shown once)")
async def create_webhook(body: CreateWebhook, ctx: Ctx, caller: Caller) -> Response:
    row, secret = await ctx.db(lambda: webhooks.register(
        ctx.store, ctx.settings, url=body.url, events=body.events, owner=caller.owner))
    return json_response(webhooks.endpoint_object(row, secret))


@router.get("", summary="Your webhook endpoints")
async def list_webhooks(ctx: Ctx, caller: Caller) -> Response:
    rows = await ctx.db(lambda: q.list_endpoints(ctx.store, caller.owner,
                                                 every_owner=caller.owner is None))
    return json_response({"object": "list", "data": [webhooks.endpoint_object(r) for r in rows]})


@router.get("/{endpoint_id}", response_model=WebhookObject, summary="A webhook endpoint")
async def get_webhook(endpoint_id: EndpointId, ctx: Ctx, caller: Caller) -> Response:
    return json_response(webhooks.endpoint_object(await owned_endpoint(ctx, caller, endpoint_id)))


@router.delete("/{endpoint_id}", summary="Remove a webhook endpoint")
async def delete_webhook(endpoint_id: EndpointId, ctx: Ctx, caller: Caller) -> Response:
    await owned_endpoint(ctx, caller, endpoint_id)
    await ctx.db(q.delete_endpoint, ctx.store, endpoint_id)
    return json_response({"id": endpoint_id, "object": "webhook_endpoint.deleted",
                          "deleted": True})


@router.get("/{endpoint_id}/attempts", summary="Delivery attempts, newest first")
async def list_attempts(endpoint_id: EndpointId, ctx: Ctx, caller: Caller,
                        limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Response:
    await owned_endpoint(ctx, caller, endpoint_id)
    rows = await ctx.db(lambda: q.list_attempts(ctx.store, endpoint_id, limit=limit))
    return json_response({"object": "list", "data": [webhooks.attempt_object(a) for a in rows]})

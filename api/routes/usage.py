"""Token usage from the store, by owner (or tenant), model and day.

    GET /v1/usage?since=YYYY-MM-DD&until=YYYY-MM-DD&model=M&group_by=owner|tenant&owner=O
        -> {"object": "list", "data": [{owner, model, day, requests, prompt_tokens,
                                        completion_tokens, total_tokens}, ...]}

A key sees its owner's usage; an admin key (`inflight keys create NAME --admin`) sees every
owner's (`owner=` narrows it). Days are UTC days of the requests' finish; only requests
that finished count. With authentication off everything is visible.
"""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response
from pydantic import BaseModel

from inflight.api.deps import Caller, Ctx
from inflight.api.errors import APIError
from inflight.api.models.errors import OPENAI_ERRORS
from inflight.api.responses import json_response
from inflight.api.routing import ApiRoute
from inflight.store.limits import usage_by_day

router = APIRouter(route_class=ApiRoute, prefix="/v1/usage", tags=["usage"],
                   responses=OPENAI_ERRORS)


class UsageRow(BaseModel):
    owner: str | None = None
    tenant: str | None = None
    model: str | None
    day: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class UsageList(BaseModel):
    object: Literal["list"] = "list"
    data: list[UsageRow]


def _day(value: str | None, name: str) -> date | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise APIError(400, f"{name}: give a day as YYYY-MM-DD (got {value!r:.40})",
                       param=name) from None


@router.get("", response_model=UsageList, summary="Token usage by owner, model and day")
async def usage(ctx: Ctx, caller: Caller,
                since: Annotated[str | None, Query(description="first day (YYYY-MM-DD)")] = None,
                until: Annotated[str | None, Query(description="last day, inclusive")] = None,
                model: Annotated[str | None, Query(max_length=256)] = None,
                owner: Annotated[str | None, Query(max_length=256)] = None,
                group_by: Literal["owner", "tenant"] = "owner") -> Response:
    start, end = _day(since, "since"), _day(until, "until")
    if caller.owner is not None and not caller.admin:
        if owner is not None and owner != caller.owner:
            raise APIError(403, "this key sees its own owner's usage only; an admin key "
                           "(`inflight keys create NAME --admin`) sees every owner's",
                           param="owner", code="permission_denied")
        owner = caller.owner
    rows: list[dict[str, Any]] = await ctx.db(
        lambda: usage_by_day(ctx.store, owner=owner, model=model, start=start, end=end,
                             by_tenant=group_by == "tenant"))
    return json_response({"object": "list", "data": rows})

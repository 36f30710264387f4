"""OpenAI Models: what this API serves (api/served_models.py).

    GET /v1/models              -> {"object": "list", "data": [Model, ...]}
    GET /v1/models/{model_id}   -> Model (`default` names the served one); 404 otherwise

A Model carries vLLM's `max_model_len` (the context length the workers cap prompts and
outputs at), null when the API cannot know it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path
from fastapi.responses import Response
from pydantic import BaseModel

from inflight.api.deps import Caller, Ctx
from inflight.api.models.errors import OPENAI_ERRORS
from inflight.api.responses import json_response
from inflight.api.routing import ApiRoute
from inflight.api.served_models import model_not_found

router = APIRouter(route_class=ApiRoute, prefix="/v1/models", tags=["models"],
                   responses=OPENAI_ERRORS)


class ModelObject(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]


@router.get("", response_model=ModelList, summary="The served models")
async def list_models(ctx: Ctx, caller: Caller) -> Response:
    return json_response({"object": "list", "data": [m.card() for m in ctx.models.models]})


@router.get("/{model_id:path}", response_model=ModelObject, summary="One served model")
async def retrieve_model(model_id: Annotated[str, Path(max_length=256)], ctx: Ctx,
                         caller: Caller) -> Response:
    found = ctx.models.get(model_id)
    if found is None:
        raise model_not_found(model_id)
    return json_response(found.card())

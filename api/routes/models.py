"""OpenAI Models: the models with live workers (api/served_models.py: the registry).

    GET /v1/models              -> {"object": "list", "data": [Model, ...]}
    GET /v1/models/{model_id}   -> Model (`default` names the default model); 404 otherwise

A Model carries vLLM's `max_model_len` (the context length its workers cap prompts and
outputs at) and `parent` (an adapter's base model; null for a base model). A model drops off
once its last worker has not been heard from for INFLIGHT_REGISTRY_TTL_S.
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
    parent: str | None = None
    kind: Literal["generate", "embed"] = "generate"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]


@router.get("", response_model=ModelList, summary="The served models")
async def list_models(ctx: Ctx, caller: Caller) -> Response:
    return json_response({"object": "list", "data": ctx.models.cards()})


@router.get("/{model_id:path}", response_model=ModelObject, summary="One served model")
async def retrieve_model(model_id: Annotated[str, Path(max_length=256)], ctx: Ctx,
                         caller: Caller) -> Response:
    found = ctx.models.get(model_id)
    if found is None:
        raise model_not_found(model_id)
    return json_response(found.card())

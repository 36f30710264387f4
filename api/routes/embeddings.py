"""POST /v1/embeddings (OpenAI's embeddings API) through the queue: one embed request per
input, filed, published to the embedding model's topic at interactive priority, and
answered together once every input's final event is in (api/follow.py), in input order.

A bad input is a 400 naming its index (`param` "input[i]") before anything is published;
one the worker refuses (too long as token ids, ...) is a 400 naming its index too. A
generation model named here is a 400 (`wrong_model_kind`); an embedding model named on a
generation route is refused by its worker the same way.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter

from inflight.api.deps import Caller, Ctx
from inflight.api.errors import APIError
from inflight.api.follow import error_status, submit, timeout_error
from inflight.api.models.embeddings import EmbeddingRequest, embedding_item, embedding_list
from inflight.api.models.errors import OPENAI_ERRORS, WAIT_ERRORS
from inflight.api.responses import json_response
from inflight.api.routing import ApiRoute
from inflight.producers import RequestNotFound
from inflight.schemas import ErrorEvent, FinalEvent, SchemaError
from inflight.schemas.events import ERR_WRONG_MODEL_KIND

router = APIRouter(route_class=ApiRoute, tags=["embeddings"], responses=OPENAI_ERRORS)

PATH = "/v1/embeddings"


@router.post(PATH, responses=WAIT_ERRORS, summary="OpenAI-compatible embeddings (through the queue)")
async def embeddings(body: EmbeddingRequest, ctx: Ctx, caller: Caller) -> Any:
    bad = body.input_errors()
    if bad:
        i, what = bad[0]
        raise APIError(400, f"input[{i}] {what}", param=f"input[{i}]", code="invalid_request")
    route = ctx.models.resolve(body.model)
    served = ctx.models.get(route.name)
    if served is not None and served.kind != "embed":
        raise APIError(400, f"model {route.name!r} is a generation model, not an embedding model: "
                            "name an embedding model (GET /v1/models lists each model's kind)",
                       param="model", code=ERR_WRONG_MODEL_KIND)
    n = len(body.inputs)
    ids = [uuid.uuid4().hex for _ in range(n)]
    try:
        reqs = body.to_wire(ids, ctx.settings.max_prompt_chars)
    except SchemaError as exc:
        raise APIError(400, str(exc), param="input", code="invalid_request") from None
    streams = []
    try:
        for req in reqs:
            streams.append(await submit(ctx, req, caller.owner, "embeddings", route))
        items, tokens = [], 0
        for i, stream in enumerate(streams):
            event = await _final(ctx, stream)
            if isinstance(event, ErrorEvent):
                err = error_status(event)
                raise APIError(err.status, f"input[{i}]: {err.message}",
                               param=f"input[{i}]" if err.status == 400 else None, code=err.code)
            if event.embedding is None:
                raise APIError(500, f"input[{i}]: the worker answered without a vector",
                               code="internal_error")
            items.append(embedding_item(i, event.embedding, body.encoding_format))
            tokens += event.usage.prompt_tokens
    finally:
        for stream in streams:
            stream.close()
    return json_response(embedding_list(route.name, items, tokens))


async def _final(ctx, stream) -> FinalEvent | ErrorEvent:
    try:
        while True:
            event = await stream.next()
            if isinstance(event, (FinalEvent, ErrorEvent)):
                return event
    except RequestNotFound as exc:
        raise timeout_error(ctx, exc) from None

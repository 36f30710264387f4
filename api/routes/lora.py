"""vLLM's run-time LoRA routes, for admin keys (INFLIGHT_API_LORA_ADMINS):

    POST /v1/load_lora_adapter    {"lora_name": "team-a", "lora_path": "/adapters/a", "model": null}
    POST /v1/unload_lora_adapter  {"lora_name": "team-a"}

The API does not load anything itself: it relays the command to the workers on the control
topic (schemas/lora.py) and answers once the broker has it (200, vLLM's text). Workers of
`model` (absent: every worker) load the folder, and the adapter appears in GET /v1/models
with `parent` once they announce it (a registry heartbeat later); a folder a worker cannot
read is logged there, and the adapter never appears.
"""

from __future__ import annotations

from anyio import to_thread
from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel, Field

from inflight.api.deps import Caller, Ctx
from inflight.api.errors import APIError
from inflight.api.models.errors import OPENAI_ERRORS, ErrorBody
from inflight.api.routing import ApiRoute

router = APIRouter(route_class=ApiRoute, prefix="/v1", tags=["lora"],
                   responses={**OPENAI_ERRORS, 403: {"model": ErrorBody,
                                                     "description": "not a LoRA admin key"}})


class LoadLoraBody(BaseModel):
    lora_name: str = Field(min_length=1, max_length=128)
    lora_path: str = Field(min_length=1, max_length=4096)
    model: str | None = Field(default=None, max_length=128)


class UnloadLoraBody(BaseModel):
    lora_name: str = Field(min_length=1, max_length=128)
    lora_int_id: int | None = None  # vLLM's; ignored
    model: str | None = Field(default=None, max_length=128)


def _admin(ctx, caller) -> None:
    admins = ctx.settings.api_lora_admins
    if caller.owner is not None and caller.owner not in admins and caller.key_id not in admins:
        raise APIError(403, f"API key of {caller.owner!r} may not load or unload LoRA adapters: "
                            "add its owner to INFLIGHT_API_LORA_ADMINS", code="permission_denied")


async def _send(ctx, action: str, name: str, path: str | None, model: str | None) -> None:
    try:
        await to_thread.run_sync(ctx.client.lora_command, action, name, path, model)
    except ValueError as exc:
        raise APIError(400, str(exc), param="lora_name", code="invalid_request_error") from None


@router.post("/load_lora_adapter", summary="Load a LoRA adapter on the workers",
             response_class=PlainTextResponse)
async def load_lora_adapter(body: LoadLoraBody, ctx: Ctx, caller: Caller) -> Response:
    _admin(ctx, caller)
    if ctx.models.get(body.lora_name) is not None:
        raise APIError(400, f"The lora adapter '{body.lora_name}' has already been loaded.",
                       param="lora_name", code="invalid_request_error")
    await _send(ctx, "load", body.lora_name, body.lora_path, body.model)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post("/unload_lora_adapter", summary="Unload a LoRA adapter from the workers",
             response_class=PlainTextResponse)
async def unload_lora_adapter(body: UnloadLoraBody, ctx: Ctx, caller: Caller) -> Response:
    _admin(ctx, caller)
    await _send(ctx, "unload", body.lora_name, None, body.model)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

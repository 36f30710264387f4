"""FastAPI dependencies: the process context and the calling principal.

Both are `async` so a cached key costs no thread hop; the security schemes put bearer
and x-api-key auth into the OpenAPI document.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from inflight.api.auth import ANONYMOUS, Principal
from inflight.api.context import ApiContext
from inflight.api.errors import APIError

_bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer inf_...`")
_x_api_key = APIKeyHeader(name="x-api-key", auto_error=False,
                          description="the same key, as the Anthropic SDK sends it")


async def context(request: Request) -> ApiContext:
    return request.app.state.ctx


async def authenticate(request: Request) -> Principal:
    """The caller, from the request's headers alone (api.routing runs this before a body
    is read): `Authorization: Bearer <key>` or `x-api-key: <key>`."""
    ctx: ApiContext = request.app.state.ctx
    if ctx.keys is None:
        return ANONYMOUS
    token = None
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        token = credentials.strip()
    elif request.headers.get("x-api-key"):
        token = request.headers["x-api-key"]
    try:
        return await ctx.keys.authenticate(token)
    except APIError:
        ctx.metrics.inc("auth_failures")
        raise


async def principal(request: Request,
                    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
                    x_api_key: Annotated[str | None, Depends(_x_api_key)]) -> Principal:
    """The caller api.routing authenticated (the security schemes above only describe the
    headers in the OpenAPI document)."""
    found = getattr(request.state, "principal", None)
    return found if found is not None else await authenticate(request)


Ctx = Annotated[ApiContext, Depends(context)]
Caller = Annotated[Principal, Depends(principal)]


def owns(caller: Principal, owner: str | None) -> bool:
    """May `caller` see a row filed under `owner`? Everyone may when auth is off."""
    return caller.owner is None or caller.owner == owner

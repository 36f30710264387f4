"""Unauthenticated probes: GET /healthz (liveness, and whether the store answers) and
GET /metrics (Prometheus text)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel
from sqlalchemy import text

from inflight.api.routing import ApiRoute
from inflight.api.deps import Ctx

router = APIRouter(route_class=ApiRoute, tags=["health"])


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    store: Literal["ok", "unreachable"]
    auth: bool


def _store_ok(ctx: Ctx) -> bool:
    try:
        with ctx.store.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return True
    except Exception:  # noqa: BLE001 — any failure means "unreachable" for a probe
        return False


@router.get("/healthz", response_model=Health, summary="Liveness and store reachability")
async def healthz(ctx: Ctx) -> Health:
    ok = await ctx.db(_store_ok, ctx)
    return Health(status="ok" if ok else "degraded", store="ok" if ok else "unreachable",
                  auth=ctx.keys is not None)


@router.get("/metrics", response_class=PlainTextResponse, summary="Prometheus counters",
            responses={200: {"content": {"text/plain": {}}}})
async def metrics(ctx: Ctx) -> PlainTextResponse:
    return PlainTextResponse(ctx.metrics.prometheus(),
                             media_type="text/plain; version=0.0.4")

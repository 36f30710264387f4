"""Unauthenticated probes: GET /healthz (liveness: the process serves; it also says
whether the store answers), GET /readyz (readiness: the broker and the database are
reachable, else 503, so a load balancer or compose's health check holds traffic back) and
GET /metrics (Prometheus text)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel
from sqlalchemy import text

from inflight.api.deps import Ctx
from inflight.api.responses import json_response
from inflight.api.routing import ApiRoute

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


class Readiness(BaseModel):
    status: Literal["ready", "not_ready"]
    broker: Literal["ok", "unreachable"]
    store: Literal["ok", "unreachable"]


@router.get("/readyz", response_model=Readiness,
            responses={503: {"model": Readiness, "description": "not ready: see which part"}},
            summary="Readiness: broker and database reachable")
async def readyz(ctx: Ctx) -> Response:
    store_ok = await ctx.db(_store_ok, ctx)
    broker_ok = await ctx.broker.ready()
    ready = store_ok and broker_ok
    body = {"status": "ready" if ready else "not_ready",
            "broker": "ok" if broker_ok else "unreachable",
            "store": "ok" if store_ok else "unreachable"}
    return json_response(body, 200 if ready else 503,
                         None if ready else {"Retry-After": str(ctx.broker.retry_after)})


@router.get("/metrics", response_class=PlainTextResponse, summary="Prometheus counters",
            responses={200: {"content": {"text/plain": {}}}})
async def metrics(ctx: Ctx) -> PlainTextResponse:
    return PlainTextResponse(ctx.metrics.prometheus(),
                             media_type="text/plain; version=0.0.4")

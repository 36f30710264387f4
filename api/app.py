"""The FastAPI application: `create_app(settings)`.

    client ─► MetricsMiddleware ─► BodyLimitMiddleware ─► auth (deps) ─► routes
                                                                          │
                      store (SQLAlchemy) ◄── polls, owners, keys ─────────┤
                      producers.Client  ◄── submit, cancel ───────────────┤
                      one results reader ◄── every stream (api/streams.py) ┘

No engine runs here: requests go to Kafka through the same client pipelines use, results
come from the same store the recorder fills.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from anyio import to_thread
from fastapi import FastAPI

from inflight.api import errors
from inflight.api.auth import KeyCache
from inflight.api.broker_health import BrokerHealth, probe_broker
from inflight.api.cache import FinalAnswers
from inflight.api.context import ApiContext, db_slots
from inflight.api.limits import BodyLimitMiddleware
from inflight.api.metrics import ApiMetrics, MetricsMiddleware
from inflight.api.routes import (batches, chat, completions, embeddings, files, health, lora,
                                 message_batches, messages, models, requests, usage, webhooks)
from inflight.api.served_models import ApiModels, default_context
from inflight.api.streams import Streams
from inflight.api.tracing import TraceparentMiddleware, TracingMiddleware
from inflight.api.upload_sweep import sweep_uploads
from inflight.producers import Client
from inflight.producers.results_reader import ResultsReader
from inflight.schemas import Settings
from inflight.schemas.errors import ConfigError, InflightError
from inflight.store import Store
from inflight.store.migrate import current_revision, head_revision
from inflight.transport import tracing
from inflight.transport.registry_reader import RegistryReader

log = logging.getLogger("inflight.api")

API_VERSION = "1"
REGISTRY_WAIT_S = 5.0   # at start: read the model registry this long before serving


def _open_store(settings: Settings) -> Store:
    # no pre-ping: a poll is one round trip (store/owner_queries.py retries a dead connection once)
    store = Store.embedded(settings.database_url, pre_ping=False, files_url=settings.files_url,
                           files_endpoint=settings.files_s3_endpoint)  # SQLite migrates itself
    if store.dialect != "sqlite":
        have, want = current_revision(store.url), head_revision()
        if have != want:
            store.close()
            raise ConfigError(f"the database is at schema revision {have!r}, this API needs "
                              f"{want!r}: run `inflight db upgrade` first")
    return store


def _warm_producer(client: Client, settings: Settings) -> str | None:
    """Fetch the request topics' metadata now, so the first submit does not block on it;
    the reason when the broker is not reachable."""
    try:
        probe_broker(settings)
        for topic in (settings.topic_requests, settings.topic_requests_batch):
            client.producer.partitions_for(topic)
    except Exception as exc:  # noqa: BLE001 — the API still serves polls without a broker
        log.warning("api: Kafka at %s is not reachable yet (%s); submits answer 503 until "
                    "it is", settings.kafka_bootstrap, exc)
        return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    return None


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    metrics = ApiMetrics(settings.metrics_interval_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await to_thread.run_sync(_open_store, settings)
        # the one reader of the results topics every stream of this process follows
        results = ResultsReader(settings, max_follows=settings.api_max_streams, name="api").start()
        # the one reader of the model registry: /v1/models and every route by model
        registry = RegistryReader(settings, name="api-registry").start()
        client = Client(settings, store=store, results=results, registry=registry,
                        registry_wait_s=0.0,
                        default_context=await to_thread.run_sync(default_context, settings))
        slots = db_slots(store)
        keys = KeyCache(store, settings.api_key_cache_s, slots) if settings.api_auth else None
        if keys is None:
            log.warning("api: AUTHENTICATION IS OFF (INFLIGHT_API_AUTH=off): anyone who can "
                        "reach this port can submit, read and cancel every request. Use "
                        "this only for a local demo.")
        broker = BrokerHealth(lambda: probe_broker(settings))
        unreachable = await to_thread.run_sync(_warm_producer, client, settings)
        if unreachable is not None:
            broker.failed(unreachable)
        elif not await to_thread.run_sync(registry.wait_ready, REGISTRY_WAIT_S):
            log.warning("api: the model registry (%s) was not read within %.0fs (%s); "
                        "named models answer 503 until it is", settings.topic_models,
                        REGISTRY_WAIT_S, registry.error or "no answer")
        app.state.ctx = ApiContext(settings=settings, store=store, client=client, keys=keys,
                                   streams=Streams(results, metrics,
                                                   settings.api_wait_timeout_s,
                                                   settings.api_keepalive_s),
                                   metrics=metrics,
                                   finals=FinalAnswers(settings.api_final_cache_bytes),
                                   db_slots=slots,
                                   models=ApiModels(client.models_client),
                                   broker=broker)
        sweep = asyncio.get_running_loop().create_task(
            sweep_uploads(store, settings.api_upload_grace_s), name="upload-sweep")
        try:
            yield
        finally:
            sweep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweep
            log.info(metrics.summary())
            await broker.close()
            with contextlib.suppress(InflightError, Exception):
                await to_thread.run_sync(client.close)
            await to_thread.run_sync(results.close)
            await to_thread.run_sync(registry.close)
            store.close()

    app = FastAPI(title="inflight", version=API_VERSION, lifespan=lifespan, debug=False,
                  description="Kafka-driven LLM inference: submit and poll requests, stream "
                              "their tokens, OpenAI-compatible chat completions, files and "
                              "batches, Anthropic messages and message batches. Every "
                              "route but /healthz, /readyz and /metrics needs an API key.")
    errors.install(app)
    for module in (health, models, requests, chat, completions, messages, files, batches,
                   message_batches, embeddings, usage, webhooks, lora):
        app.include_router(module.router)
    app.add_middleware(BodyLimitMiddleware, body_bytes=settings.api_max_body_bytes,
                       upload_bytes=settings.api_max_upload_bytes)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    tracer = tracing.tracer(settings, "inflight.api")  # None: OpenTelemetry is off
    if tracer is not None:
        app.add_middleware(TracingMiddleware, tracer=tracer)
    else:  # a caller's traceparent still reaches Kafka
        app.add_middleware(TraceparentMiddleware)
    return app


def app_from_env() -> FastAPI:
    """uvicorn factory for `inflight api --workers N` (each worker reads INFLIGHT_*)."""
    return create_app(Settings())

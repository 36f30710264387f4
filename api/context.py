"""What every handler shares in one API process: settings, the store, the producer client,
the key cache, the open streams (api/streams.py) and the counters. Built by `create_app`'s lifespan and
reached through the dependencies in api/deps.py (no module-level state)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import anyio
from anyio import to_thread

from inflight.api.auth import KeyCache
from inflight.api.broker_health import BrokerHealth
from inflight.api.cache import FinalAnswers
from inflight.api.group_commit import ClaimQueue
from inflight.api.group_read import ViewQueue
from inflight.api.metrics import ApiMetrics
from inflight.api.served_models import ApiModels
from inflight.api.streams import Streams
from inflight.producers import Client
from inflight.schemas import InferenceRequest, Settings
from inflight.schemas.errors import BrokerError
from inflight.store import Store
from inflight.transport.reply_rules import ReplyNames

T = TypeVar("T")


def db_slots(store: Store) -> anyio.CapacityLimiter:
    """As many database threads as the store's pool keeps connections.

    NOTE: more threads than pooled connections make SQLAlchemy open "overflow" connections
    and close them again on return: a new Postgres backend per request under load."""
    size = getattr(store.engine.pool, "size", None)
    return anyio.CapacityLimiter(size() if callable(size) else 5)


@dataclass
class ApiContext:
    settings: Settings
    store: Store
    client: Client
    keys: KeyCache | None          # None = INFLIGHT_API_AUTH=off
    streams: Streams
    metrics: ApiMetrics
    finals: FinalAnswers
    db_slots: anyio.CapacityLimiter
    models: ApiModels
    broker: BrokerHealth
    claims: ClaimQueue = field(init=False)
    views: ViewQueue = field(init=False)
    reply_names: ReplyNames = field(init=False)   # POST /v1/requests' reply_to, by its name

    def __post_init__(self) -> None:
        self.claims = ClaimQueue(self.store, self.db, self.metrics)
        self.views = ViewQueue(self.store, self.db, self.metrics)
        self.reply_names = ReplyNames(self.settings)

    async def db(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking store call on one of the database threads."""
        return await to_thread.run_sync(fn, *args, limiter=self.db_slots)

    async def publish(self, req: InferenceRequest, topic: str | None = None,
                      key: str | None = None) -> None:
        """Send one request (to `topic`: its route's; None: its model's) and wait until
        Kafka acknowledged it, at most
        INFLIGHT_API_PUBLISH_TIMEOUT_S; BrokerError otherwise. While the broker is known to
        be down, a 503 at once (api/broker_health.py)."""
        self.broker.check()
        timeout = self.settings.api_publish_timeout_s
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if not done.done():
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(BrokerError(f"publishing {req.request_id} failed: {error}"))

        try:
            with anyio.fail_after(timeout):
                # NOTE: abandoned on timeout: a send can block on metadata while the broker
                # is away; the thread ends on its own, the client gets its 503 now
                future = await to_thread.run_sync(partial(self.client.send, req, topic, key=key),
                                                  abandon_on_cancel=True)
                future.add_callback(lambda _meta: loop.call_soon_threadsafe(settle, None))
                future.add_errback(lambda exc: loop.call_soon_threadsafe(settle, exc))
                await done
        except TimeoutError:
            self.broker.failed(f"no acknowledgement within {timeout:g}s")
            raise BrokerError(f"the broker did not acknowledge {req.request_id} within "
                              f"{timeout:g}s (INFLIGHT_API_PUBLISH_TIMEOUT_S)") from None
        except BrokerError as exc:
            self.broker.failed(str(exc).splitlines()[0][:200])
            raise
        self.broker.ok()

"""What this API process knows about the Kafka broker, so an outage is answered fast.

    up ── a publish fails or times out (or the broker is away at start) ──► down
    down: every submit answers 503 at once, Retry-After 1, 2, 4 ... 30 s (growing with
          each failed probe); a probe (a fresh connection and a metadata request, bounded
          by PROBE_TIMEOUT_S) runs every Retry-After seconds
    down ── a probe or a publish succeeds ──► up

`/readyz` reports the same state (and probes when nothing was sent for a while), so a
load balancer stops sending submits to a process whose broker is away; `/healthz` stays
liveness only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from anyio import to_thread

from inflight.api.errors import APIError
from inflight.schemas import Settings
from inflight.transport.kafka_clients import plain_consumer

log = logging.getLogger("inflight.api")

PROBE_TIMEOUT_S = 1.5
MAX_RETRY_AFTER_S = 30
READY_PROBE_EVERY_S = 5.0  # /readyz probes at most this often while the broker is up


def probe_broker(settings: Settings, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Connect anew and fetch the cluster's metadata within `timeout_s`; BrokerError (or
    a KafkaError) when the broker does not answer."""
    ms = int(timeout_s * 1000)
    consumer = plain_consumer(settings, bootstrap_timeout_ms=ms, request_timeout_ms=ms)
    try:
        consumer.topics()
    finally:
        consumer.close()


class BrokerHealth:
    def __init__(self, probe: Callable[[], None]):
        self._probe = probe
        self.down_since: float | None = None
        self.retry_after = 1
        self.reason = ""
        self._prober: asyncio.Task | None = None
        self._checked_at = 0.0

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def check(self) -> None:
        """Raise the 503 a submit gets while the broker is known to be down."""
        if self.down_since is not None:
            raise APIError(503, f"the message broker is unavailable ({self.reason}); retry in "
                                f"{self.retry_after}s", code="broker_unavailable",
                           headers={"Retry-After": str(self.retry_after)})

    def failed(self, reason: str) -> None:
        """A publish (or a probe) failed: the broker is down; probing starts."""
        if self.down_since is None:
            log.warning("api: the message broker is unavailable (%s); submits answer 503 "
                        "until a probe reaches it", reason)
            self.down_since = time.monotonic()
            self.retry_after = 1
        self.reason = reason
        if self._prober is None or self._prober.done():
            self._prober = asyncio.get_running_loop().create_task(self._probe_until_up())

    def ok(self) -> None:
        if self.down_since is not None:
            log.info("api: the message broker is back after %.1fs",
                     time.monotonic() - self.down_since)
        self.down_since = None
        self.retry_after = 1
        self._checked_at = time.monotonic()

    async def probe(self) -> bool:
        """Probe now (on a thread); True when the broker answered."""
        try:
            await to_thread.run_sync(self._probe, abandon_on_cancel=True)
        except Exception as exc:  # noqa: BLE001 — any failure means "not reachable"
            self.failed(str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
            return False
        self.ok()
        return True

    async def ready(self) -> bool:
        """For /readyz: the known state, refreshed by a probe when it is old."""
        if self.down:
            return False
        if time.monotonic() - self._checked_at >= READY_PROBE_EVERY_S:
            return await self.probe()
        return True

    async def _probe_until_up(self) -> None:
        while self.down_since is not None:
            await asyncio.sleep(self.retry_after)
            if await self.probe():
                return
            self.retry_after = min(self.retry_after * 2, MAX_RETRY_AFTER_S)

    async def close(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._prober

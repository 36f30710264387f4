"""Which `reply_to` topics a request may name: checked at intake, before it runs.

    allowed  = matches INFLIGHT_REPLY_TO_PATTERN (full match), and is none of the project's
               own topics (requests, results, DLQ, cancel, registry, any model's requests)
    exists   = the broker lists it (a metadata request, at most REFRESH_S apart for a topic
               not seen yet; a topic once seen is trusted for KNOWN_S)

A refused request ends with an error final (code reply_to_refused, field reply_to) on the
shared results topic only, and its raw copy goes to the DLQ.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from inflight.schemas import Settings
from inflight.transport.reply_rules import ReplyNames

log = logging.getLogger("inflight.worker")

REFRESH_S = 2.0        # an unknown topic: the topic list is asked again at most this often
KNOWN_S = 300.0        # a topic seen: trusted this long before it is looked up again
LIST_TIMEOUT_S = 2.0   # one metadata request, at most (the intake must keep polling)


class ReplyTopics:
    def __init__(self, settings: Settings):
        self.names = ReplyNames(settings)  # ConfigError for a bad pattern
        self.settings = settings
        self._known: dict[str, float] = {}      # topic -> when it was last listed
        self._listed_at = float("-inf")
        self._admin: Any = None

    def refusal(self, topic: str) -> str | None:
        """Why `topic` may not be a reply_to (None: it may)."""
        why = self.names.refusal(topic)
        if why is not None:
            return why
        if not self.exists(topic):
            return (f"reply_to topic {topic!r} does not exist; create it before sending "
                    "requests that name it")
        return None

    def exists(self, topic: str) -> bool:
        now = time.monotonic()
        seen = self._known.get(topic)
        if seen is not None and now - seen < KNOWN_S:
            return True
        if now - self._listed_at >= REFRESH_S:
            self._listed_at = now
            for name in self._list():
                self._known[name] = now
        return topic in self._known and now - self._known[topic] < KNOWN_S

    def _list(self) -> list[str]:
        """The broker's topic names (nothing when it does not answer in time)."""
        try:
            if self._admin is None:
                from confluent_kafka.admin import AdminClient

                self._admin = AdminClient({**self.settings.rdkafka_common(),
                                           **self.settings.kafka_rdkafka_options})
            md = self._admin.list_topics(timeout=LIST_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - the broker away: the topic counts as unknown
            log.warning("reply_to: could not list the broker's topics (%s)", exc)
            return []
        return [name for name, t in md.topics.items() if t.error is None]

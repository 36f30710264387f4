"""Which topics a request may name as `reply_to`, as far as the name alone tells: not one of
inflight's own topics (requests, results, DLQ, cancel, registry, any model's requests) and a
full match of INFLIGHT_REPLY_TO_PATTERN. The API refuses the others with a 400 before
anything is sent; the worker's intake checks them again, and that the topic exists
(consumers/reply_to.py), before the request runs. Each builds one `ReplyNames` at start, so
a pattern that is not a regular expression stops it there (ConfigError)."""

from __future__ import annotations

import re

from inflight.schemas.errors import ConfigError
from inflight.schemas.settings import Settings


class ReplyNames:
    def __init__(self, settings: Settings):
        try:
            self.pattern = re.compile(settings.reply_to_pattern)
        except re.error as exc:
            raise ConfigError(f"INFLIGHT_REPLY_TO_PATTERN {settings.reply_to_pattern!r} is "
                              f"not a regular expression: {exc}") from None
        self.own = frozenset(settings.topics())
        self.own_prefixes = (settings.topic_requests + ".", settings.topic_requests_batch + ".")

    def refusal(self, topic: str) -> str | None:
        """Why `topic` may not be a reply_to by its name (None: it may, if it exists)."""
        if topic in self.own or topic.startswith(self.own_prefixes):
            return f"reply_to {topic!r} is one of inflight's own topics; name a topic of your own"
        if not self.pattern.fullmatch(topic):
            return (f"reply_to {topic!r} is not allowed: it does not match "
                    f"INFLIGHT_REPLY_TO_PATTERN ({self.pattern.pattern!r})")
        return None

"""Which topics a request may name as `reply_to`, as far as the name alone tells: not one of
inflight's own topics (requests, results, DLQ, cancel, registry, any model's requests) and a
full match of INFLIGHT_REPLY_TO_PATTERN. The API refuses the others with a 400 before
anything is sent; the worker's intake checks them again, and that the topic exists
(consumers/reply_to.py), before the request runs."""

from __future__ import annotations

import functools
import re

from inflight.schemas.errors import ConfigError
from inflight.schemas.settings import Settings


@functools.lru_cache(maxsize=8)
def reply_to_pattern(pattern: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"INFLIGHT_REPLY_TO_PATTERN {pattern!r} is not a regular expression: "
                          f"{exc}") from None


def reply_to_name_refusal(settings: Settings, topic: str) -> str | None:
    """Why `topic` may not be a reply_to by its name (None: it may, if it exists)."""
    if topic in settings.topics() or topic.startswith(
            (settings.topic_requests + ".", settings.topic_requests_batch + ".")):
        return f"reply_to {topic!r} is one of inflight's own topics; name a topic of your own"
    pattern = reply_to_pattern(settings.reply_to_pattern)
    if not pattern.fullmatch(topic):
        return (f"reply_to {topic!r} is not allowed: it does not match "
                f"INFLIGHT_REPLY_TO_PATTERN ({pattern.pattern!r})")
    return None

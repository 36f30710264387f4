"""Which request topics and worker group belong to a model.

The default model (INFLIGHT_DEFAULT_MODEL; unset: the one model of the deployment) keeps
today's names, so existing producers keep working; every other model has its own:

    default model        inflight.requests             inflight.requests.batch             group inflight-workers
    model M              inflight.requests.model.<S>   inflight.requests.batch.model.<S>   group inflight-workers.model.<S>

(the bases are INFLIGHT_TOPIC_REQUESTS, INFLIGHT_TOPIC_REQUESTS_BATCH, INFLIGHT_WORKER_GROUP).
Results, DLQ, cancel and registry topics are shared by every model.

<S> is the model id made safe for a topic name, reversibly (`topic_safe` / `model_of`):
letters, digits and "-" stay as they are; every other character (model ids are visible
ASCII: schemas.base.ModelId) becomes "_" and its two lowercase hex digits:

    SmolLM2-135M-Instruct   -> SmolLM2-135M-Instruct
    google/gemma-3-270m     -> google_2fgemma-3-270m
    Llama-3.1-8B            -> Llama-3_2e1-8B
    team_a:lora             -> team_5fa_3alora

NOTE (why "." is escaped too): Kafka's topic names allow [a-zA-Z0-9._-] (at most 249
characters), but two names that differ only in "." against "_" collide in its metrics, and
Kafka refuses the second. With "." escaped and "_" only starting an escape, no two model
ids give colliding names, and a name reads back to exactly one id.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from inflight.schemas.errors import ConfigError
from inflight.schemas.registry import DEFAULT_ALIAS
from inflight.schemas.settings import Settings

MAX_TOPIC_LEN = 249
MODEL_INFIX = ".model."
_LITERAL = frozenset(string.ascii_letters + string.digits + "-")


def topic_safe(model_id: str) -> str:
    """The model id as a topic-name part (see the module doc)."""
    return "".join(c if c in _LITERAL else f"_{ord(c):02x}" for c in model_id)


def model_of(safe: str) -> str:
    """The model id a `topic_safe` part came from; ValueError when it is not one."""
    out, i = [], 0
    while i < len(safe):
        c = safe[i]
        if c == "_":
            code = safe[i + 1:i + 3]
            if len(code) != 2 or not all(h in "0123456789abcdef" for h in code):
                raise ValueError(f"{safe!r}: '_' at {i} is not followed by two hex digits")
            out.append(chr(int(code, 16)))
            i += 3
        elif c in _LITERAL:
            out.append(c)
            i += 1
        else:
            raise ValueError(f"{safe!r}: {c!r} at {i} is not a letter, digit, '-' or escape")
    return "".join(out)


@dataclass(frozen=True)
class ModelTopics:
    """A model's request topics and its workers' consumer group."""

    model: str | None      # None: the default model, whatever its name
    requests: str
    batch: str
    group: str
    default: bool

    @classmethod
    def default_of(cls, settings: Settings) -> "ModelTopics":
        return cls(None, settings.topic_requests, settings.topic_requests_batch,
                   settings.worker_group, True)

    @classmethod
    def named(cls, settings: Settings, model_id: str) -> "ModelTopics":
        """The topics of a model that is not the default one; ConfigError when its name
        would make a topic name longer than Kafka allows."""
        safe = MODEL_INFIX + topic_safe(model_id)
        topics = cls(model_id, settings.topic_requests + safe,
                     settings.topic_requests_batch + safe, settings.worker_group + safe, False)
        longest = max(len(topics.requests), len(topics.batch))
        if longest > MAX_TOPIC_LEN:
            raise ConfigError(f"model {model_id!r} makes a request topic name of {longest} "
                              f"characters, over Kafka's {MAX_TOPIC_LEN}: serve it under a "
                              "shorter name (--served-model-name)")
        return topics

    @classmethod
    def of(cls, settings: Settings, model_id: str | None) -> "ModelTopics":
        """By name alone: None, `default` and the settings' default model id are the
        default model's topics (a router that reads the registry asks it first:
        producers/models_client.py)."""
        if model_id is None or model_id == DEFAULT_ALIAS or model_id == settings.default_model_id():
            return cls.default_of(settings)
        return cls.named(settings, model_id)

    def for_priority(self, batch: bool) -> str:
        return self.batch if batch else self.requests


def worker_topics(settings: Settings, served: str) -> ModelTopics:
    """The topics a worker serving `served` reads: the default model's when it serves the
    default (INFLIGHT_DEFAULT_MODEL unset, or naming `served`), its model's own otherwise."""
    if settings.default_model is None or settings.default_model == served:
        return ModelTopics(served, settings.topic_requests, settings.topic_requests_batch,
                           settings.worker_group, True)
    return ModelTopics.named(settings, served)

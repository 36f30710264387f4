"""The models a deployment serves now, and where a request for one goes: what
`Client.models()`, `Client.submit(model=...)`, the API's /v1/models and its routes, and the
batch jobs' validation share.

    models = ModelsClient(settings)           # follows the registry from the first call
    models.models()                           # [ServedModel], those with live workers
    route = models.route("gemma-3-270m")      # Route: wire model, topics, context length
    models.route("nope")                      # ModelNotFoundError (allow_unserved=True: its topics)

The registry (schemas/registry.py, transport/registry_reader.py) says which models have
live workers, their context length and the topics their workers read. The default model
(a request with no `model`, or `default`) always routes, live or not, to today's topics:
a deployment that serves one model needs no registry to take requests, and requests wait
in Kafka for workers that start later. A named model that no live worker announces is a
ModelNotFoundError, unless the caller allows unserved models (a pipeline that starts
before its workers): then it goes to the topics its name gives (transport/model_topics.py).

On the wire, a request for the default model carries no `model` (whatever name the caller
used for it), so the default's workers take it whatever their settings call it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from inflight.schemas.errors import BrokerError, ModelNotFoundError
from inflight.schemas.registry import DEFAULT_ALIAS, ModelRecord
from inflight.schemas.settings import Settings
from inflight.transport.model_topics import ModelTopics
from inflight.transport.registry_reader import RegistryReader

log = logging.getLogger("inflight.models")

OWNER = "inflight"
READY_WAIT_S = 10.0    # a client's first named model: wait this long for the registry
REFRESH_S = 0.5        # the live view is rebuilt at most this often (records expire)


@dataclass(frozen=True)
class ServedModel:
    """A model with live workers, as GET /v1/models lists it."""

    id: str
    kind: str
    parent: str | None                 # an adapter: the base model it runs on
    max_model_len: int | None
    dtype: str | None
    quantization: str | None
    workers: tuple[str, ...]
    default: bool
    topics: ModelTopics
    created: int                       # when its first live worker started (epoch seconds)

    def card(self) -> dict[str, Any]:
        """OpenAI's Model object, plus vLLM's `max_model_len` and `parent` (an adapter's
        base model; null for a base model) and `kind`: "generate" or "embed" (an embedding
        model: POST /v1/embeddings)."""
        return {"id": self.id, "object": "model", "created": self.created, "owned_by": OWNER,
                "max_model_len": self.max_model_len, "parent": self.parent, "kind": self.kind}


@dataclass(frozen=True)
class Route:
    """Where one request goes."""

    model: str | None          # the wire request's `model` (None: the default model)
    name: str                  # the model's name, for answers and the stored row
    topics: ModelTopics
    max_model_len: int | None  # its context length when known (the registry's)
    served: bool               # a live worker announces it

    def topic(self, batch: bool) -> str:
        return self.topics.for_priority(batch)


def aggregate(records: list[ModelRecord]) -> dict[str, ServedModel]:
    """{model id: ServedModel} from live records: one entry per model, its workers
    together (the smallest context length, the earliest start); each adapter a base record
    lists is an entry of its own whose `parent` is the base."""
    by_model: dict[str, list[ModelRecord]] = {}
    for r in records:
        by_model.setdefault(r.model, []).append(r)
        for adapter in r.adapters:
            by_model.setdefault(adapter, []).append(
                r.model_copy(update={"model": adapter, "parent": r.model, "adapters": []}))
    out = {}
    for model, rs in by_model.items():
        first = min(rs, key=lambda r: r.started_at)
        lengths = [r.max_model_len for r in rs if r.max_model_len is not None]
        default = any(r.default for r in rs)
        out[model] = ServedModel(
            id=model, kind=first.kind, parent=first.parent,
            max_model_len=min(lengths) if lengths else None, dtype=first.dtype,
            quantization=first.quantization, workers=tuple(sorted({r.worker for r in rs})),
            default=default,
            topics=ModelTopics(None if default else model, first.requests_topic,
                               first.batch_topic, first.group, default),
            created=int(first.started_at))
    return out


class ModelsClient:
    def __init__(self, settings: Settings, reader: RegistryReader | None = None, *,
                 wait_s: float = READY_WAIT_S, default_context: int | None = None):
        """`reader`: a registry reader to share (the API's); by default one starts at the
        first call that needs it. `wait_s`: how long a call may wait for the registry to
        be read the first time (the API passes 0: it never blocks a request on it).
        `default_context`: the default model's context length while none of its workers
        is live (producers.batch_lines.context_length)."""
        self.settings = settings
        self.wait_s = wait_s
        self.default_context = default_context
        self._reader = reader
        self._own_reader = reader is None
        self._view: dict[str, ServedModel] = {}
        self._view_at = -1.0
        self._warned_defaults: frozenset[str] = frozenset()
        # NOTE: routing runs per request: what the settings say is worked out once, the
        # default's live route once per refresh of the view
        self._default_id = settings.default_model_id()
        self._default_topics = ModelTopics.default_of(settings)
        self._settings_default = Route(None, self._default_id, self._default_topics,
                                       default_context, False)
        self._live_default_route = self._settings_default

    @property
    def reader(self) -> RegistryReader:
        if self._reader is None:
            self._reader = RegistryReader(self.settings, name="client-registry").start()
        return self._reader

    def close(self) -> None:
        if self._reader is not None and self._own_reader:
            self._reader.close()
            self._reader = None

    # -- listing ---------------------------------------------------------------------------
    def live(self) -> dict[str, ServedModel]:
        """{id: ServedModel} of the models with live workers (rebuilt every REFRESH_S)."""
        now = time.monotonic()
        if now - self._view_at >= REFRESH_S:
            self._ready()
            self._view = aggregate(self.reader.live())
            self._view_at = now
            self._check_defaults()
            found = self._live_default(self._view)
            self._live_default_route = self._settings_default if found is None else Route(
                None, found.id, self._default_topics, found.max_model_len, True)
        return self._view

    def models(self) -> list[ServedModel]:
        """The models with live workers, the default first, then by id."""
        return sorted(self.live().values(), key=lambda m: (not m.default, m.id))

    def get(self, model_id: str) -> ServedModel | None:
        """A live model by id; `default` names the default model."""
        live = self.live()
        if model_id == DEFAULT_ALIAS:
            return self._live_default(live)
        return live.get(model_id)

    def default_name(self) -> str:
        """The default model's id: its live workers', else the settings' (INFLIGHT_DEFAULT_MODEL,
        INFLIGHT_SERVED_MODEL_NAME, the folder's name)."""
        found = self._live_default(self.live())
        return found.id if found is not None else self._default_id

    # -- routing ---------------------------------------------------------------------------
    def route(self, model: str | None, *, allow_unserved: bool = False) -> Route:
        """Where a request for `model` goes. ModelNotFoundError when no live worker serves a
        named model (unless `allow_unserved`: its topics by name, for workers to come)."""
        if model is None or model == DEFAULT_ALIAS or model == self._default_id:
            return self._default_route()
        live = self.live()
        found = live.get(model)
        if found is not None:
            # NOTE: an adapter of the default model reads the default's topics but keeps its
            # own name on the wire (the worker runs it as the base model + that adapter)
            if found.default and found.parent is None:
                return self._live_default_route
            return Route(model, model, found.topics, found.max_model_len, True)
        if allow_unserved:
            return Route(model, model, ModelTopics.of(self.settings, model), None, False)
        served = tuple(sorted(live))
        raise ModelNotFoundError(
            f"model {model!r} is not served: no live worker announces it "
            f"({'served now: ' + ', '.join(served) if served else 'no model has live workers'}; "
            "`inflight models` lists them). Start its workers (`inflight worker "
            "--served-model-name ...`), or submit anyway for workers that start later "
            "(allow_unserved=True, `inflight submit --allow-unserved`)",
            model=model, served=served)

    def topics(self, model: str | None) -> ModelTopics:
        """The topics of a request already routed (never raises: an unserved model goes to
        the topics its name gives)."""
        if model is None:
            return self._default_topics
        return self.route(model, allow_unserved=True).topics

    def _default_route(self) -> Route:
        """The default model's route: with its live workers' name and context length once
        the registry is read (a client that never named a model does not read it)."""
        if self._reader is not None and self._reader.ready:
            self.live()
            return self._live_default_route
        return self._settings_default

    def _live_default(self, live: dict[str, ServedModel]) -> ServedModel | None:
        defaults = [m for m in live.values() if m.default and m.parent is None]
        if not defaults:
            return None
        return min(defaults, key=lambda m: m.created)

    def _check_defaults(self) -> None:
        names = frozenset(m.id for m in self._view.values() if m.default and m.parent is None)
        if len(names) > 1 and names != self._warned_defaults:
            log.warning("models %s all read the default model's topics (%s): set "
                        "INFLIGHT_DEFAULT_MODEL on every process of the deployment",
                        ", ".join(sorted(names)), self.settings.topic_requests)
        self._warned_defaults = names

    def _ready(self) -> None:
        """Wait (at most wait_s) for the registry to be read once; BrokerError when it
        has not been (a named model cannot be told served or not)."""
        reader = self.reader
        if reader.ready or (self.wait_s > 0 and reader.wait_ready(self.wait_s)):
            return
        raise BrokerError(f"the model registry ({self.settings.topic_models}) has not been "
                          f"read yet" + (f" ({reader.error})" if reader.error else "")
                          + "; is the broker up? (`inflight topics create` makes the topic)")

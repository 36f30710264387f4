"""What one worker serves: its model id, the topics and group it reads, the registry record
it announces, and which requests are for it.

    serving = Serving.of(settings, engine, worker="host:42")
    serving.topics            # ModelTopics: today's names for the default model, else its own
    serving.accepts(req.model)  # False: the request was written to the wrong topic
    serving.record(now)       # schemas.registry.ModelRecord to announce

The model id is INFLIGHT_SERVED_MODEL_NAME (`inflight worker --served-model-name`), else the
model folder's name. A worker serves the default model when INFLIGHT_DEFAULT_MODEL names its
model, or, unset, unless live workers of another model read the default's topics already
(consumers/worker.py reads the registry at start); a request with no `model` (or `default`)
is the default model's. Anything else that reaches a worker (a producer wrote it to another
model's topic) ends `model_not_found` and never runs on these weights.

LoRA adapters (engine/lora, `inflight worker --lora NAME=PATH`): their names are model ids
too, listed in the worker's record (`adapters`; readers list each with `parent` = this
model) and routed to this model's topics; a request naming one runs on this model with
that adapter (`lora_of`). The set changes while the worker runs (adapters loaded and
unloaded at run time), so it is kept in `adapters`, a set shared by reference.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from inflight.schemas.base import MODEL_ID_RE
from inflight.schemas.errors import ConfigError
from inflight.schemas.registry import DEFAULT_ALIAS, ModelRecord
from inflight.schemas.settings import Settings
from inflight.transport.model_topics import ModelTopics, worker_topics


def served_model_id(settings: Settings, engine: Any) -> str:
    """INFLIGHT_SERVED_MODEL_NAME, else the engine's model folder name (the settings'
    folder for an engine that does not say: tests' and benchmarks' fakes); ConfigError when
    it is not a model id (visible ASCII, no spaces, at most 128 characters)."""
    name = settings.served_model_name
    config = getattr(engine, "config", None)
    if not name and config is not None and getattr(config, "model", None):
        name = os.path.basename(os.path.normpath(str(config.model)))
    name = name or settings.served_model_id()
    if not MODEL_ID_RE.match(name):
        raise ConfigError(f"served model name {name!r} is not a model id (visible ASCII "
                          "characters, no spaces, at most 128): set --served-model-name / "
                          "INFLIGHT_SERVED_MODEL_NAME")
    return name


def check_adapter_name(name: str) -> str:
    """An adapter's name is a model id (requests name it by `model`): ConfigError if not."""
    if not isinstance(name, str) or not MODEL_ID_RE.match(name):
        raise ConfigError(f"LoRA adapter name {name!r} is not a model id (visible ASCII "
                          "characters, no spaces, at most 128): rename it (--lora NAME=PATH)")
    return name


def _quantization(engine: Any) -> str | None:
    quant = getattr(getattr(getattr(engine, "model", None), "config", None), "quantization", None)
    return getattr(quant, "label", None) or (str(quant) if quant is not None else None)


@dataclass(frozen=True)
class Serving:
    model: str
    topics: ModelTopics
    max_model_len: int | None = None
    dtype: str | None = None
    quantization: str | None = None
    kind: str = "generate"  # "embed": an embedding model (engine.kind)
    adapters: set[str] = dataclasses.field(default_factory=set)

    @classmethod
    def of(cls, settings: Settings, engine: Any) -> "Serving":
        model = served_model_id(settings, engine)
        config = getattr(engine, "config", None)
        length = getattr(engine, "max_model_len", None)
        loras = getattr(engine, "list_loras", None)
        for a in loras() if loras is not None else ():
            check_adapter_name(a["name"])
        return cls(model, worker_topics(settings, model),
                   max_model_len=length if isinstance(length, int) else None,
                   dtype=getattr(config, "dtype", None), quantization=_quantization(engine),
                   kind="embed" if getattr(engine, "kind", None) == "embed" else "generate",
                   adapters={a["name"] for a in loras()} if loras is not None else set())

    @property
    def default(self) -> bool:
        return self.topics.default

    def named(self, settings: Settings) -> "Serving":
        """The same model on its own topics and group (another model is the default)."""
        return dataclasses.replace(self, topics=ModelTopics.named(settings, self.model))

    def accepts(self, model: str | None) -> bool:
        """Whether a request naming `model` is for this worker's weights."""
        if model is None or model == DEFAULT_ALIAS:
            return self.default
        return model == self.model or model in self.adapters

    def lora_of(self, model: str | None) -> dict[str, str]:
        """The add_request keyword of a request naming `model`: {"lora": name} for one of
        this worker's adapters, else {} (engines without adapters are never given it)."""
        if model is not None and model != self.model and model in self.adapters:
            return {"lora": model}
        return {}

    def refusal(self, model: str | None, topic: str) -> str:
        """The error message of a request `accepts` refused, read from `topic`."""
        asked = (f"names no model (the default model's), " if model in (None, DEFAULT_ALIAS)
                 else f"is for model {model!r}, ")
        return (f"the request {asked}but was written to {topic}, which workers of "
                f"{self.model!r} read; it did not run. Publish it to its model's topic "
                "(producers route by `model`: Client.submit(model=...), the HTTP API); "
                "`inflight models` lists the models served")

    def kind_refusal(self, kind: str) -> str:
        """The error message of a request of the other kind than this worker serves."""
        if self.kind == "embed":
            return (f"model {self.model!r} is an embedding model: it embeds (kind 'embed', "
                    "POST /v1/embeddings, Client.embed) and cannot generate text")
        return (f"model {self.model!r} is a generation model: it cannot embed; send the "
                "embedding request to an embedding model (`inflight models` lists the kind of each)")

    def record(self, worker: str, settings: Settings, started_at: float) -> ModelRecord:
        """The registry record of this worker (heartbeat_at set at each beat)."""
        return ModelRecord(model=self.model, kind=self.kind, adapters=sorted(self.adapters),
                           max_model_len=self.max_model_len, dtype=self.dtype,
                           quantization=self.quantization, worker=worker,
                           requests_topic=self.topics.requests, batch_topic=self.topics.batch,
                           group=self.topics.group, default=self.default,
                           heartbeat_at=started_at, heartbeat_s=settings.registry_heartbeat_s,
                           started_at=started_at)

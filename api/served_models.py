"""The models this API serves: what GET /v1/models lists, and the check of a request's
`model` (an unknown one is a 404 as OpenAI answers it; `default` and no model at all
mean the served one).

The served model comes from the configuration the workers use: its id is
INFLIGHT_SERVED_MODEL_NAME, else the model folder's name (INFLIGHT_MODEL_PATH, else the
bundled model's); its context length is what the workers cap it at
(producers.batch_lines.context_length: INFLIGHT_BATCH_CONTEXT_LENGTH, else
max_position_embeddings from the folder's config.json, capped by INFLIGHT_MAX_MODEL_LEN).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from inflight.api.errors import APIError
from inflight.producers.batch_lines import context_length
from inflight.schemas import Settings
from inflight.schemas.errors import ConfigError
from inflight.schemas.settings import BUNDLED_MODEL_NAME

log = logging.getLogger("inflight.api")

DEFAULT_ALIAS = "default"
OWNER = "inflight"


@dataclass(frozen=True)
class ServedModel:
    id: str
    max_model_len: int | None   # None: not known here (no config.json, no setting)
    created: int

    def card(self) -> dict[str, object]:
        """OpenAI's Model object, plus vLLM's `max_model_len`."""
        return {"id": self.id, "object": "model", "created": self.created, "owned_by": OWNER,
                "max_model_len": self.max_model_len}


def model_not_found(name: str) -> APIError:
    return APIError(404, f"The model `{name}` does not exist or you do not have access to it. "
                         "GET /v1/models lists the served models; `default` is the served one.",
                    param="model", code="model_not_found")


class ServedModels:
    def __init__(self, settings: Settings):
        folder = (Path(settings.model_path) if settings.model_path
                  else settings.cache_dir / "models" / BUNDLED_MODEL_NAME)
        try:
            length = context_length(settings, folder)
        except ConfigError as exc:
            log.warning("api: %s; /v1/models shows no context length", exc)
            length = settings.max_model_len
        config = folder / "config.json"
        created = int(config.stat().st_mtime) if config.is_file() else int(time.time())
        self.models = (ServedModel(settings.served_model_name or folder.name, length, created),)

    @property
    def default(self) -> ServedModel:
        return self.models[0]

    def get(self, model_id: str) -> ServedModel | None:
        if model_id == DEFAULT_ALIAS:
            return self.default
        return next((m for m in self.models if m.id == model_id), None)

    def resolve(self, requested: str | None) -> ServedModel:
        """The model a request asks for (None: the default), or APIError 404."""
        if not requested:
            return self.default
        found = self.get(requested)
        if found is None:
            raise model_not_found(requested)
        return found

"""The models this API serves, from the live registry (producers/models_client.py): what
GET /v1/models lists and where a request's `model` routes.

- GET /v1/models lists the models with live workers (a model drops off once its last
  worker has not been heard from for INFLIGHT_REGISTRY_TTL_S); an adapter carries `parent`.
- A request with no `model`, `default`, or the default model's name goes to the default
  model's topics, live or not (requests wait in Kafka for workers that come later, as with
  one model); any other name must have live workers, else 404 `model_not_found` as OpenAI
  answers it.
- The registry not read yet (the broker away since the API started): a named model is a
  503 (the API cannot tell), the default still routes.

The default model's context length while none of its workers is live is the settings'
(producers.batch_lines.context_length: INFLIGHT_BATCH_CONTEXT_LENGTH, else
max_position_embeddings of the folder's config.json, capped by INFLIGHT_MAX_MODEL_LEN).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from inflight.api.errors import APIError
from inflight.producers.batch_lines import context_length
from inflight.producers.models_client import ModelsClient, Route, ServedModel
from inflight.schemas import Settings
from inflight.schemas.errors import ConfigError, ModelNotFoundError
from inflight.schemas.settings import BUNDLED_MODEL_NAME

log = logging.getLogger("inflight.api")


def model_not_found(name: str, served: tuple[str, ...] = ()) -> APIError:
    listed = f" Served now: {', '.join(served)}." if served else ""
    return APIError(404, f"The model `{name}` does not exist or you do not have access to it."
                         f"{listed} GET /v1/models lists the served models; `default` is the "
                         "default one.", param="model", code="model_not_found")


def default_context(settings: Settings) -> int | None:
    """The default model's context length from the settings (see the module doc)."""
    folder = (Path(settings.model_path) if settings.model_path
              else settings.cache_dir / "models" / BUNDLED_MODEL_NAME)
    try:
        return context_length(settings, folder)
    except ConfigError as exc:
        log.warning("api: %s; the default model's context length is unknown until a worker "
                    "announces it", exc)
        return settings.max_model_len


class ApiModels:
    """The API's view of the served models: a thin layer over the Client's ModelsClient
    that answers in HTTP terms (APIError 404)."""

    def __init__(self, models: ModelsClient):
        self.client = models

    def resolve(self, requested: str | None) -> Route:
        """The route of a request's `model` (None: the default), or APIError 404."""
        try:
            return self.client.route(requested)
        except ModelNotFoundError as exc:
            raise model_not_found(exc.model, exc.served) from None

    @property
    def default(self) -> Route:
        return self.client.route(None)

    def list(self) -> list[ServedModel]:
        return self.client.models()

    def get(self, model_id: str) -> ServedModel | None:
        return self.client.get(model_id)

    def cards(self) -> list[dict[str, Any]]:
        return [m.card() for m in self.list()]

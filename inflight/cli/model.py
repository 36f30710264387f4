"""`inflight model fetch` resolves the model folder to serve, with the settings' defaults
(INFLIGHT_MODEL_PATH, INFLIGHT_CACHE_DIR). The logic (the bundled models, SmolLM2-135M by
default or `--name gemma3-270m`, converted once from their GGUF files; an explicit Hugging
Face folder checked) lives in
engine/model_folder.py, which takes its folders as arguments."""

from __future__ import annotations

import os
from pathlib import Path

from inflight.engine import model_folder
from inflight.engine.model_folder import DEFAULT_MODEL_NAME, is_hf_folder
from inflight.schemas.settings import Settings

__all__ = ["DEFAULT_MODEL_NAME", "default_model_dir", "ensure_bundled_model", "ensure_default_model",
           "is_hf_folder", "resolve_model"]


def default_model_dir(settings: Settings | None = None) -> Path:
    return model_folder.default_model_dir((settings or Settings()).cache_dir)


def ensure_default_model(settings: Settings | None = None, install: bool = True) -> Path:
    return model_folder.ensure_default_model((settings or Settings()).cache_dir, install=install)


def ensure_bundled_model(name: str, settings: Settings | None = None, install: bool = True) -> Path:
    """A bundled model (`inflight model fetch --name NAME`), converted once into the cache."""
    return model_folder.ensure_bundled_model((settings or Settings()).cache_dir, name, install=install)


def resolve_model(path: str | os.PathLike | None = None, settings: Settings | None = None) -> Path:
    """An explicit path, else INFLIGHT_MODEL_PATH, else the default model."""
    settings = settings or Settings()
    return model_folder.resolve_model(path or settings.model_path, settings.cache_dir)

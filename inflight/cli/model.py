"""`inflight model fetch` resolves the model folder to serve. The logic (the bundled
SmolLM2-135M converted once from its GGUF file; an explicit Hugging Face folder checked)
lives in engine/model_folder.py, where the worker's engine_bridge takes it from: the
library never imports this package (the composition root)."""

from inflight.engine.model_folder import (DEFAULT_MODEL_NAME, default_model_dir, ensure_default_model,
                                 is_hf_folder, resolve_model)

__all__ = ["DEFAULT_MODEL_NAME", "default_model_dir", "ensure_default_model", "is_hf_folder",
           "resolve_model"]

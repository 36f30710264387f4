"""`inflight quantize MODEL -o OUT --scheme w8|w4 [--group-size G] [--method rtn|gptq] [--calib FILE]`.

Reads an unquantized Hugging Face folder of a supported architecture and writes a new
folder the engine loads like any model:

    OUT/config.json        the source config + a `quantization` section (engine/quant/config.py)
    OUT/model.safetensors  per projection `.qweight`, `.scales` (+ `.qzeros` for w4); every
                           other tensor (embeddings, norms, LM head, biases) in 16 bits
                           (fp32 sources become bf16; 16-bit sources are kept)
    OUT/<the rest>         tokenizer and generation files, copied

The folder is written beside OUT and renamed into place at the end, so a crash never
leaves a half-written model that the engine would trust.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
import time
from typing import Callable

import torch

from inflight.engine.model import ModelConfig, load_tensors
from inflight.engine.quant.calibrate import gptq_model
from inflight.engine.quant.calibration import default_calibration, text_digest, token_windows
from inflight.engine.quant.config import LINEAR_NAMES, QuantConfig
from inflight.engine.quant.rtn import QuantizedWeight, quantize_w4, quantize_w8
from inflight.engine.tokenizer import Tokenizer
from inflight.engine.errors import ConfigError, ModelError

log = logging.getLogger("inflight.quantize")

# 32,768 tokens in short windows: on SmolLM2-135M, the same tokens cut in 128-token windows
# closed more of w4's gap out of domain than in 256- or 512-token ones (docs/benchmarks.md)
CALIB_SAMPLES = 256
CALIB_SEQ_LEN = 128


def _load(folder: pathlib.Path) -> dict[str, torch.Tensor]:
    tensors = load_tensors(folder)
    # one naming for the rest of this module: "model.layers.0...", "model.embed_tokens..."
    return {(k if k.startswith(("model.", "lm_head.")) else "model." + k): v for k, v in tensors.items()}


def _check_source(src: pathlib.Path) -> tuple[dict, ModelConfig]:
    path = src / "config.json"
    if not path.is_file():
        raise ModelError(f"{src} has no config.json: give a Hugging Face model folder")
    raw = json.loads(path.read_text())
    if raw.get("quantization") is not None:
        q = raw["quantization"]
        raise ModelError(f"{src} is already quantized ({q.get('scheme')} {q.get('method')}): "
                         "quantize the original, unquantized folder instead")
    cfg = ModelConfig.from_folder(src)  # unsupported architectures / foreign formats raise
    if cfg.fused_checkpoint:
        raise ModelError(f"{src}: {cfg.family} stores q|k|v and gate|up fused (qkv_proj, "
                         "gate_up_proj); `inflight quantize` reads them separate")
    return raw, cfg


def _rtn(w: torch.Tensor, quant: QuantConfig, device: str) -> QuantizedWeight:
    w = w.to(device)
    qw = quantize_w8(w) if quant.scheme == "w8" else quantize_w4(w, quant.group_size)
    return QuantizedWeight(*(None if t is None else t.cpu() for t in (qw.qweight, qw.scales, qw.zeros)))


def _sixteen_bit(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16) if t.dtype == torch.float32 else t


def quantize_model(src: str | os.PathLike, out: str | os.PathLike, quant: QuantConfig,
                   calib: str | os.PathLike | None = None, num_samples: int = CALIB_SAMPLES,
                   seq_len: int = CALIB_SEQ_LEN,
                   progress: Callable[[str], None] | None = None, device: str = "cpu") -> pathlib.Path:
    """Quantize the model folder `src` into the new folder `out` and return its path.
    GPTQ calibrates on `num_samples` windows of `seq_len` tokens: by default the model's own
    chat answers plus stdlib docstrings (engine/quant/calibration.py), or the text file `calib`. `device`: where
    round-to-nearest runs ("cuda" for big models; GPTQ runs on the CPU)."""
    src, out = pathlib.Path(src), pathlib.Path(out)
    say = progress or log.info
    raw, cfg = _check_source(src)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out} already exists and is not empty: choose another output folder "
                          "or delete it first")
    if num_samples < 1 or seq_len < 2:
        raise ConfigError(f"calibration needs at least 1 sample of 2 tokens (got {num_samples} x {seq_len})")
    if src.resolve() == out.resolve():
        raise ConfigError("the output folder must differ from the source folder")
    t0 = time.monotonic()
    tensors = _load(src)
    missing = [n for i in range(cfg.num_layers) for n in LINEAR_NAMES
               if f"model.layers.{i}.{n}.weight" not in tensors]
    if missing:
        raise ModelError(f"{src}: projection weights missing from the safetensors files: {missing[:3]}")
    if calib is not None and quant.method != "gptq":
        raise ConfigError("--calib is for --method gptq (round-to-nearest needs no calibration text)")

    calibration: dict = {}
    if quant.method == "gptq" and not cfg.is_llama2_math(seq_len):
        raise ConfigError(f"{src}: GPTQ calibrates with a Llama-2 forward (plain RoPE, full "
                          f"attention, SwiGLU); this {cfg.family} model's layers differ: "
                          "use --method rtn")
    if quant.method == "gptq":
        text_path = pathlib.Path(calib) if calib is not None else None
        if text_path is not None and not text_path.is_file():
            raise ConfigError(f"calibration file {text_path} does not exist")
        tok = Tokenizer(src, cfg.eos_token_ids)
        if text_path is not None:
            text = text_path.read_text(encoding="utf-8")
            windows = token_windows(tok.encode, text, num_samples, seq_len)
            calibration = {"text": str(text_path), "text_sha256_16": text_digest(text),
                           "samples": num_samples, "seq_len": seq_len}
        else:
            windows, calibration = default_calibration(src, tok.encode, num_samples, seq_len,
                                                       device=device, progress=say)
        windows = torch.tensor(windows)
        say(f"calibrating on {num_samples} x {seq_len} tokens of {calibration['text']}")
        quantized = gptq_model(tensors.get, cfg, quant, windows, say)
    else:
        quantized = {}
        for i in range(cfg.num_layers):
            t1 = time.monotonic()
            for name in LINEAR_NAMES:
                full = f"model.layers.{i}.{name}"
                quantized[full] = _rtn(tensors[full + ".weight"], quant, device)
            say(f"layer {i + 1}/{cfg.num_layers}: rtn {quant.label} {time.monotonic() - t1:.2f}s")
    quant = QuantConfig(quant.scheme, quant.group_size, quant.method, calibration)

    stored: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if name.endswith(".weight") and name[:-len(".weight")] in quantized:
            continue
        stored[name] = _sixteen_bit(t).contiguous()
    for name, qw in quantized.items():
        stored.update(qw.tensors(name))
    _write(src, out, raw, quant, stored)
    say(f"wrote {out} ({quant.label}, {sum(t.nbytes for t in stored.values()) / 1e6:.1f} MB) "
        f"in {time.monotonic() - t0:.1f}s")
    return out


def _write(src: pathlib.Path, out: pathlib.Path, raw: dict, quant: QuantConfig,
           stored: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_file(stored, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = dict(raw, quantization=quant.to_json())
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        for f in src.iterdir():
            if f.is_file() and f.name != "config.json" and not f.name.startswith("model") \
                    and not f.name.endswith((".safetensors", ".bin", ".pt", ".pth", ".gguf")):
                shutil.copy2(f, tmp / f.name)
        if out.exists():
            out.rmdir()  # checked empty above
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

"""Quantized tiny models for tests, and their dequantized twins that `transformers` loads.

    q = quantized(tiny, tmp / "w4", "w4", group_size=32)        # `inflight quantize` output
    ref = dequantized_reference(q, tmp / "w4-ref")               # plain fp32 HF folder, same weights
"""

from __future__ import annotations

import json
import pathlib
import shutil

import torch

CALIB = dict(num_samples=4, seq_len=32)  # enough for GPTQ on a 64-wide model, in a second


def quantized(src, dest, scheme: str, group_size: int | None = None, method: str = "rtn") -> pathlib.Path:
    from inflight.engine.quant.config import QuantConfig
    from inflight.engine.quant.quantize import quantize_model

    return quantize_model(src, dest, QuantConfig(scheme, group_size, method),
                          progress=lambda line: None, **(CALIB if method == "gptq" else {}))


def dequantized_reference(qfolder, dest) -> pathlib.Path:
    """The quantized folder with every projection dequantized to fp32 `.weight` (the math of
    kernels/quant.py) and every other tensor in fp32: what the engine should compute."""
    from safetensors.torch import load_file, save_file

    from inflight.kernels.quant import dequantize_w4, dequantize_w8

    qfolder, dest = pathlib.Path(qfolder), pathlib.Path(dest)
    config = json.loads((qfolder / "config.json").read_text())
    quant = config.pop("quantization")
    t = load_file(str(qfolder / "model.safetensors"))
    out = {}
    for name, tensor in t.items():
        if name.endswith(".qweight"):
            base = name[:-len(".qweight")]
            if quant["scheme"] == "w8":
                w = dequantize_w8(tensor, t[base + ".scales"], torch.float32)
            else:
                w = dequantize_w4(tensor, t[base + ".scales"], t[base + ".qzeros"],
                                  quant["group_size"], torch.float32)
            out[base + ".weight"] = w
        elif not name.endswith((".scales", ".qzeros")):
            out[name] = tensor.float()
    dest.mkdir(parents=True, exist_ok=True)
    save_file(out, str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps(config))
    for f in qfolder.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            shutil.copy2(f, dest / f.name)
    return dest

"""The llama.cpp GGUF files of benchmarks/cpu_peers.py: one GGUF rewritten at F32 and Q8_0.

    PYTHONPATH=<llama.cpp>/gguf-py python benchmarks/peers/gguf_precisions.py SRC.gguf OUT_PREFIX

writes OUT_PREFIX-F32.gguf (every tensor dequantized to fp32: the weights the engine's
converted folder holds), OUT_PREFIX-Q8_0.gguf (every 2-D tensor of those fp32 weights in
Q8_0, 1-D ones in F32, as `llama-quantize ... Q8_0` does) and OUT_PREFIX-Q4_1.gguf (a copy of
SRC), skipping files that exist. It uses the gguf-py package vendored in llama.cpp's sources
(numpy codecs of the same blocks ggml reads), so the benchmark needs only llama.cpp's
library built, not its tools (build_llama_cpp.sh).
"""

from __future__ import annotations

import pathlib
import shutil
import sys

import numpy as np


def rewrite(src: pathlib.Path, dest: pathlib.Path, target: str) -> None:
    import gguf
    from gguf.quants import dequantize, quantize

    qt = gguf.GGMLQuantizationType
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(str(dest) + ".part", arch)
    file_type = gguf.LlamaFileType.ALL_F32 if target == "F32" else gguf.LlamaFileType.MOSTLY_Q8_0
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name == gguf.Keys.General.FILE_TYPE:
            writer.add_file_type(file_type)
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for t in reader.tensors:
        w = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32, copy=False)
        shape = [int(d) for d in reversed(t.shape)]  # numpy order (ggml's ne reversed)
        w = w.reshape(shape)
        if target == "Q8_0" and w.ndim == 2 and shape[-1] % 32 == 0:
            writer.add_tensor(t.name, quantize(w, qt.Q8_0), raw_dtype=qt.Q8_0)
        else:
            writer.add_tensor(t.name, np.ascontiguousarray(w))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    pathlib.Path(str(dest) + ".part").rename(dest)


def main() -> None:
    src, prefix = pathlib.Path(sys.argv[1]), sys.argv[2]
    for target in ("F32", "Q8_0"):
        dest = pathlib.Path(f"{prefix}-{target}.gguf")
        if not dest.is_file():
            rewrite(src, dest, target)
            print(f"wrote {dest}")
    q41 = pathlib.Path(f"{prefix}-Q4_1.gguf")
    if not q41.is_file():
        shutil.copyfile(src, q41)


if __name__ == "__main__":
    main()

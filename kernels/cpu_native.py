"""The project's C++ CPU kernels (kernels/csrc/), built once per machine on first use.

    native()  -> the module (f32_linear: engine/quant/linear.py; w8_linear, w4_linear:
                 kernels/quant_cpu.py; rms_norm, rope_write_kv, silu_mul, decode_attention:
                 kernels/cpu_ops.py), or None

torch.utils.cpp_extension compiles the sources with the C++ compiler and ninja found on
the machine (about a minute, once) and caches the library under $TORCH_EXTENSIONS_DIR
(default ~/.cache/torch_extensions), keyed by the sources' contents. The AVX-512 loops are
chosen at run time (`__builtin_cpu_supports`), so a cached library never runs instructions
the CPU lacks. Where it cannot be built, `native()` logs why, once, and returns None: the
callers keep their torch paths (the same results, slower).
"""

from __future__ import annotations

import functools
import logging
import pathlib

log = logging.getLogger(__name__)
CSRC = pathlib.Path(__file__).with_name("csrc")
SOURCES = ("bindings.cpp", "cpu_dense_linear.cpp", "cpu_quant_linear.cpp", "cpu_decoder_ops.cpp")


@functools.lru_cache(maxsize=None)
def native():
    try:
        from torch.utils.cpp_extension import load

        return load(name="inflight_cpu_kernels", sources=[str(CSRC / s) for s in SOURCES],
                    extra_cflags=["-O3", "-ffp-contract=off", "-fopenmp-simd"], verbose=False)
    except Exception as exc:  # noqa: BLE001 - no compiler here: the torch paths stay
        log.warning("the CPU kernels in kernels/csrc could not be built (%s: %s); the CPU forward "
                    "and quantized layers use their torch paths instead", type(exc).__name__,
                    str(exc).splitlines()[0][:300] if str(exc) else "")
        return None

"""The project's C++ CPU kernels (kernels/csrc/), built once per machine on first use.

    native()  -> the module (f32_linear: engine/quant/linear.py; w8_linear, w4_linear:
                 kernels/quant_cpu.py; rms_norm, rope_write_kv, silu_mul, decode_attention:
                 kernels/cpu_ops.py; lora_add: kernels/lora.py), or None

torch.utils.cpp_extension compiles the sources with the C++ compiler and ninja found on
the machine (about a minute, once). The library lives in a folder named by a hash of the
sources, the flags and the torch version, under $INFLIGHT_KERNELS_CACHE (default
$TORCH_EXTENSIONS_DIR/inflight, else ~/.cache/torch_extensions/inflight), so every checkout and
installed copy with the same sources shares one build.

NOTE: a process imports a finished build (its `ready` marker written) directly and never enters
torch's JIT, whose `lock` file stays behind when a process is killed while holding it and then
makes every later load wait forever (workers are killed with SIGKILL in production and in the
tests). Builds are serialised by an flock, which the OS drops with a dead process; whoever holds
it removes a torch `lock` left by a killed builder before building.

The AVX-512 loops are chosen at run time (`__builtin_cpu_supports`), so a cached library never
runs instructions the CPU lacks. Where it cannot be built, `native()` logs why, once, and returns
None: the callers keep their torch paths (the same results, slower).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import logging
import os
import pathlib

log = logging.getLogger(__name__)
CSRC = pathlib.Path(__file__).with_name("csrc")
SOURCES = ("bindings.cpp", "cpu_dense_linear.cpp", "cpu_quant_linear.cpp", "cpu_decoder_ops.cpp", "cpu_lora.cpp")
NAME = "inflight_cpu_kernels"
# NOTE: -fopenmp is what makes at::parallel_for split work over torch's threads: it is a header
# template, and compiled without OpenMP it runs the whole range on the calling thread (every
# kernel here was single-threaded, whatever torch.set_num_threads said, until stop 39). The
# library's libgomp.so.1 is the one torch already loaded (the loader matches the soname), so
# there is one thread pool.
CFLAGS = ("-O3", "-ffp-contract=off", "-fopenmp")
LDFLAGS = ("-fopenmp",)


def build_dir() -> pathlib.Path:
    """The folder of this exact build: sources, flags and torch version hashed."""
    import torch

    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update(name.encode() + b"\0" + (CSRC / name).read_bytes() + b"\0")
    digest.update(" ".join(CFLAGS + LDFLAGS).encode() + b"\0" + torch.__version__.encode())
    root = os.environ.get("INFLIGHT_KERNELS_CACHE") or os.path.join(
        os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.expanduser("~/.cache/torch_extensions"),
        "inflight")
    return pathlib.Path(root) / f"{NAME}-{digest.hexdigest()[:16]}"


def _import(folder: pathlib.Path):
    spec = importlib.util.spec_from_file_location(NAME, folder / f"{NAME}.so")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(folder: pathlib.Path):
    from torch.utils.cpp_extension import load

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "build.flock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)   # released by the OS if this process dies
        if (folder / "ready").exists():    # another process built it while we waited
            return _import(folder)
        (folder / "lock").unlink(missing_ok=True)   # torch's baton, left by a killed builder
        module = load(name=NAME, sources=[str(CSRC / s) for s in SOURCES],
                      extra_cflags=list(CFLAGS), extra_ldflags=list(LDFLAGS),
                      build_directory=str(folder), verbose=False)
        (folder / "ready").write_text("built\n")
        return module


@functools.lru_cache(maxsize=None)
def native():
    try:
        import torch  # noqa: F401 - the extension links against the loaded torch

        folder = build_dir()
        if (folder / "ready").exists():
            return _import(folder)
        return _build(folder)
    except Exception as exc:  # noqa: BLE001 - no compiler here: the torch paths stay
        log.warning("the CPU kernels in kernels/csrc could not be built (%s: %s); the CPU forward "
                    "and quantized layers use their torch paths instead", type(exc).__name__,
                    str(exc).splitlines()[0][:300] if str(exc) else "")
        return None

#!/usr/bin/env bash
# Build llama.cpp for benchmarks/cpu_peers.py from the `llama-cpp-python` sdist on the
# package index (it vendors llama.cpp's sources at the version its bindings expect), and
# write the GGUF files of the benchmark's model at each precision it compares.
#
#   bash benchmarks/peers/build_llama_cpp.sh [GGUF]     # from the repository root
#
# GGUF: the model's GGUF file (default: the bundled SmolLM2-135M-Instruct Q4_1 file that
# `inflight model fetch` converts). Everything lands under .cache/peers/ (git-ignored;
# override with PEERS_CACHE):
#   llama_cpp_python-$VERSION/          the unpacked sdist: vendor/llama.cpp, and the ctypes
#                                       bindings (llama_cpp/llama_cpp.py) the benchmark drives
#   build/bin/                          libllama.so and its ggml libraries (LLAMA_TARGETS adds
#                                       tools, e.g. "llama llama-bench llama-quantize")
#   models/<name>-{F32,Q8_0,Q4_1}.gguf  the model at each precision (below, written by
#                                       benchmarks/peers/gguf_precisions.py with the sdist's gguf-py)
# Nothing here is committed: sources, binaries and models stay in the cache. Native build
# (-march=native: this machine's AVX-512, VNNI, BF16), Release, shared libraries, no
# CURL/OpenSSL. NOTE: without ggml's AMX kernels (-mno-amx-*): on this machine (a VM that
# lists AMX) their first quantized matmul dies with SIGILL in ggml_backend_amx_mul_mat;
# F32 never reaches them, Q8_0/Q4_1 take the AVX-512 VNNI kernels instead.
# The library alone is 78 compile steps (the tools add ~60 more, llama.cpp's `common`): 10-20
# minutes on two idle cores, much longer on a loaded machine; reruns skip what exists.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
CACHE=${PEERS_CACHE:-.cache/peers}
JOBS=${JOBS:-$(nproc)}
TARGETS=${LLAMA_TARGETS:-llama}
mkdir -p "$CACHE/models"
CACHE=$(cd "$CACHE" && pwd)
SRC="$CACHE/llama_cpp_python-$VERSION"

if [ ! -d "$SRC/vendor/llama.cpp" ]; then
    echo "build_llama_cpp: downloading the llama-cpp-python $VERSION sdist"
    "$PY" -m pip download --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$CACHE"
    tar xzf "$CACHE/llama_cpp_python-$VERSION.tar.gz" -C "$CACHE"
fi

BUILD="$CACHE/build"
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if [ ! -f "$BUILD/bin/libllama.so" ] || ! grep -q -- "-mno-amx-tile" "$BUILD/CMakeCache.txt" 2>/dev/null; then
    echo "build_llama_cpp: cmake build in $BUILD ($JOBS jobs)"
    cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON \
        -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX"
    cmake --build "$BUILD" -j "$JOBS" --target $TARGETS
fi

# The GGUF the engine's default model is converted from (the bundled Q4_1 file: token
# embedding / tied output head in Q8_0, the decoder's projections in Q4_1); F32 is that file
# dequantized, i.e. the very weights the engine's converted folder holds, and Q8_0 is
# quantized from them (gguf-py's numpy codecs, the same blocks llama-quantize writes). Q4_1
# is the bundled file itself.
SRC_GGUF=${1:-$("$PY" -c "from inflight.engine.bundled_models import SMOLLM2 as m; from inflight.engine.model_folder import _package_dir; print(_package_dir(m, True) / m.gguf)")}
NAME=$(basename "$SRC_GGUF" .gguf)
NAME=${NAME%.Q4_1}
PYTHONPATH="$SRC/vendor/llama.cpp/gguf-py" "$PY" benchmarks/peers/gguf_precisions.py "$SRC_GGUF" "$CACHE/models/$NAME"
echo "build_llama_cpp: done: $BUILD/bin, $CACHE/models"
ls -la "$CACHE/models"

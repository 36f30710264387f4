#!/usr/bin/env bash
# Prepare the GPU check (benchmarks/gpu/run_all.sh) on THIS machine, which can reach the
# package index; the GPU machine cannot.
#
#   bash benchmarks/gpu/prepare.sh            # from the repository root
#
# Writes (both git-ignored; name them in the device run's `carry`):
#   .whl/           wheels of the Python packages the GPU image lacks, at the exact versions
#                   of this project's venv, for CPython 3.12 on x86-64 Linux
#   .gpu/tokenizer/ the tokenizer files of the converted default model (SmolLM2-135M), for
#                   the random-weight checkpoints run_all.sh builds there
# The GPU image already has torch, triton, transformers, tokenizers, safetensors, numpy,
# pytest, pytest-timeout, hypothesis, jinja2 (docs/gpu-check.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
echo "prepare: versions from $PY ($("$PY" --version))"

# Our direct needs on the engine / benchmark / test path, and theirs (pip download --no-deps
# fetches exactly these; keep one version of each).
PACKAGES=(pydantic pydantic_core pydantic-settings python-dotenv annotated-types
          typing-inspection typing_extensions orjson kafka-python confluent-kafka SQLAlchemy
          alembic Mako
          llguidance jsonschema jsonschema-specifications referencing rpds-py attrs)

pins=()
for name in "${PACKAGES[@]}"; do
    version=$("$PY" -m pip show "$name" 2>/dev/null | awk '/^Version:/ {print $2}')
    if [ -z "$version" ]; then
        echo "prepare: $name is not installed in $PY's environment" >&2
        exit 1
    fi
    pins+=("$name==$version")
done

rm -rf .whl
mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d .whl "${pins[@]}"
# the project itself: its folders install as inflight.* only through the wheel's package
# mapping (a plain PYTHONPATH of the checkout has no inflight.engine)
rm -rf build ./*.egg-info  # a stale build/ would put deleted modules into the wheel
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl .
echo "prepare: $(ls .whl | wc -l) wheels in .whl/ ($(du -sh .whl | cut -f1)): ${pins[*]}"

# The tokenizer of the default model (converted once from the bundled GGUF if needed).
model=$("$PY" -c "from inflight.cli.model import ensure_default_model; print(ensure_default_model())")
rm -rf .gpu/tokenizer
mkdir -p .gpu/tokenizer
for f in "$model"/*; do
    case "$(basename "$f")" in
        *.safetensors|*.bin|*.gguf|config.json|generation_config.json) ;;
        *) cp "$f" .gpu/tokenizer/ ;;
    esac
done
echo "prepare: tokenizer files in .gpu/tokenizer/: $(ls .gpu/tokenizer | tr '\n' ' ')"
echo "prepare: total to carry $(du -shc .whl .gpu | tail -1 | cut -f1) (the device run's limit is 64 MiB with the tree)"

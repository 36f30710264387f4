#!/usr/bin/env bash
# The GPU check (the GPU decode step and the engine's GPU figures; docs/gpu-check.md) in ONE
# device call of <= 9 minutes.
#
#   here:        bash benchmarks/gpu/prepare.sh          (wheels -> .whl/, tokenizer -> .gpu/)
#   device run:  command "bash benchmarks/gpu/run_all.sh", carry [".whl", ".gpu"], timeout_s 570
#
# Stages, in order of importance, each time-boxed (`timeout`) and all of them inside one
# budget (GPU_CHECK_BUDGET_S, default 530 s): a stage that hangs costs its own box, never
# the run; a stage that no longer fits is skipped and says so.
#   install     the carried wheels into /tmp/site (the image lacks pydantic, orjson, ...)
#   models      random-weight bf16 checkpoints: SmolLM2-135M shape and the "1B" shape
#   tests       the GPU-only tests (tests/engine/test_cuda.py: devices, streams, KV sizing
#               after profiling, ...; test_kv_sizing.py, test_device.py) and the kernel
#               tests on CUDA (8-bit KV caches included: tests/kernels/test_kv_quant.py)
#   profile-*   benchmarks/step_profile.py, batch 1/32/256, CUDA graphs on and off
#   throughput-* benchmarks/throughput.py --device cuda, 2,048 requests vs HF static batches
#   kernels     benchmarks/bench_kernels.py --quick (eager and CUDA-graph replay)
#   lora        the LoRA shrink/expand kernel (kernels/triton_lora.py) against its torch
#               references on CUDA (tests/kernels/test_lora.py; the engine-level LoRA
#               tests need peft, which the box lacks)
#   quant-tests the W8A16 / W4A16 kernel tests on CUDA (tests/kernels/test_quant_matmul.py)
#   quant       benchmarks/bench_quant_gemm.py: the 1B shape's GEMMs at batch 1/16/64 vs bf16
#               cuBLAS (CUDA-graph replay), then decode ms/step of the 1B model quantized
#               w8 / w4-g128 (round-to-nearest on the GPU) vs bf16
#   structured  benchmarks/structured.py --device cuda on the 135M shape (random weights:
#               the decode cost and the compile times; validity needs the real weights):
#               constrained vs free step ms at batch 1/32/64 (CUDA graphs, overlap off while
#               grammars run), host µs per constrained sequence per step
#   tp          benchmarks/tensor_parallel.py at TP=1 (one GPU): the plain engine vs the
#               tensor-parallel code path over one rank, 1B shape, CUDA graphs on and off:
#               the plumbing's cost per decode step (must be about 0), tokens identical
#   spec-verify benchmarks/spec_verify.py on the 1B shape: a verification step (1 + k tokens
#               per request, k = 4, 8) against a plain decode step (CUDA graphs) at batch
#               1 and 32; the issue-20 target: k = 4 at batch 1 <= 1.3x plain
#   spec-decode benchmarks/spec_decode.py --device cuda on the 1B shape, batch 1 and 32:
#               n-gram on repetitive prompts and the target as its own draft (random
#               weights accept nothing from another draft), tok/s with and without
#   kv8         bench_kernels.py --kv-only: decode attention and the KV write on int8 / fp8
#               KV caches against the bf16 cache (CUDA-graph replay; kernels/kv_quant.py)
#   families-exact-*  each model family's exactness test (tests/engine/test_families.py)
#               on the GPU, fp32 then bf16
#   family-*    a random checkpoint of each family's real shape (Llama-3.1-8B, Qwen2.5-7B,
#               Qwen3-8B, Mistral-7B, Gemma-3-4B, Phi-3-mini; FAMILY_LAYERS layers, 4 by
#               default) through benchmarks/throughput.py (256 requests) vs HF static
#               batches (64 requests)
# GPU_CHECK_ONLY="families family" runs only the stages whose names start with one of
# those words (install and models always run): the family stages do not fit in the same
# call as the rest, so they are a second call of their own (GPU_CHECK_ONLY=tp: the tp stage
# alone, when the first call's budget ran out before it).
# Everything lands in $OUT (at most 8 files come back): run_all.log (all output),
# summary.md (the tables), results.json (all figures).
#
# GPU_CHECK_SMOKE=1 runs the same stages on CPU with tiny shapes (checks the plumbing
# here; no figure of it means anything).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-/tmp/gpu-check-out}
WORK=${GPU_CHECK_WORK:-/tmp/gpu-check}
SMOKE=${GPU_CHECK_SMOKE:-0}
BUDGET=${GPU_CHECK_BUDGET_S:-530}
mkdir -p "$OUT" "$WORK/json"
DEADLINE=$(( $(date +%s) + BUDGET ))
LOG=$OUT/run_all.log
exec > >(tee -a "$LOG") 2>&1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

# stage NAME LIMIT_S COMMAND...: run COMMAND with at most LIMIT_S seconds (less if the
# budget is shorter), log its rc and time to $WORK/stages.tsv.
stage() {
    local name=$1 limit=$2
    shift 2
    if [ -n "${GPU_CHECK_ONLY:-}" ] && [ "$name" != install ] && [ "$name" != models ]; then
        local word picked=0
        for word in $GPU_CHECK_ONLY; do [[ "$name" == "$word"* ]] && picked=1; done
        if (( ! picked )); then
            echo "=== $name: not selected (GPU_CHECK_ONLY=$GPU_CHECK_ONLY)"
            return 0
        fi
    fi
    local left=$(( DEADLINE - $(date +%s) - 5 ))
    if (( left < 20 )); then
        echo "=== $name: SKIPPED (budget spent)"
        printf '%s\tskipped\t0\n' "$name" >> "$WORK/stages.tsv"
        return 0
    fi
    (( limit > left )) && limit=$left
    echo "=== $name (time box ${limit}s) $(date +%T)"
    local t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@"
    local rc=$?
    local dt=$(( $(date +%s) - t0 ))
    (( rc == 124 || rc == 137 )) && echo "=== $name: TIMED OUT after ${dt}s"
    echo "=== $name: rc=$rc in ${dt}s"
    printf '%s\t%s\t%s\n' "$name" "$rc" "$dt" >> "$WORK/stages.tsv"
    return 0
}

: > "$WORK/stages.tsv"
echo "GPU check: $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), smoke=$SMOKE"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

# -- install -----------------------------------------------------------------------------
if [ "$SMOKE" = 1 ]; then
    PY=${PY:-$ROOT/.venv/bin/python}
    [ -x "$PY" ] || PY=python3
    export PYTHONPATH=$ROOT
else
    PY=python3
    stage install 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .whl/*.whl
    # the project's own wheel (prepare.sh) is among them: inflight.* resolves from /tmp/site
    export PYTHONPATH=/tmp/site:$ROOT
fi
"$PY" -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"

# -- models ------------------------------------------------------------------------------
TOK=$ROOT/.gpu/tokenizer
M135=$WORK/models/smollm2-135m-shape
M1B=$WORK/models/1b-shape
if [ "$SMOKE" = 1 ]; then
    DEVICE=cpu DTYPE=float32
    [ -d "$TOK" ] || TOK=$("$PY" -c "from inflight.cli.model import ensure_default_model; print(ensure_default_model())")
    SHAPE_135M=(--layers 2 --hidden 64 --heads 4 --kv-heads 2 --inter 128 --dtype float32)
    SHAPE_1B=(--layers 3 --hidden 128 --heads 4 --kv-heads 2 --inter 256 --dtype float32)
    BATCHES=1,4 STEPS=3 REQUESTS=8 HF_REQUESTS=4 SEQS=8 TOKENS=512
else
    DEVICE=cuda DTYPE=bfloat16
    SHAPE_135M=()
    SHAPE_1B=(--layers 16 --hidden 2048 --heads 32 --kv-heads 8 --inter 8192)
    BATCHES=1,32,256 STEPS=30 REQUESTS=2048 HF_REQUESTS=512 SEQS=256 TOKENS=8192
fi
stage models 150 bash -c "'$PY' benchmarks/gpu/make_model.py '$M135' '$TOK' ${SHAPE_135M[*]} && \
                          '$PY' benchmarks/gpu/make_model.py '$M1B' '$TOK' ${SHAPE_1B[*]}"

# -- GPU tests ---------------------------------------------------------------------------
GPU_TESTS=(tests/engine/test_cuda.py tests/engine/test_kv_sizing.py tests/engine/test_device.py
           tests/engine/test_structured.py::test_on_cuda_with_graphs_and_overlapped_outputs
           tests/engine/spec/test_cuda.py)
if [ "$SMOKE" = 1 ]; then
    stage tests 120 "$PY" -m pytest -q -p no:cacheprovider "${GPU_TESTS[@]}"
else
    stage tests 240 "$PY" -m pytest -q -p no:cacheprovider -x "${GPU_TESTS[@]}" \
        tests/kernels/test_engine_triton.py tests/kernels/test_attention.py \
        tests/kernels/test_elementwise.py tests/kernels/test_kv_quant.py
fi

# -- decode step profile -------------------------------------------------------------------
for shape in 1b 135m; do
    model=$M1B; [ "$shape" = 135m ] && model=$M135
    stage "profile-$shape" 110 "$PY" benchmarks/step_profile.py --model "$model" --device "$DEVICE" \
        --dtype "$DTYPE" --batch-sizes "$BATCHES" --cuda-graphs both --steps "$STEPS" \
        --json "$WORK/json/profile-$shape.json"
done

# -- throughput vs HF static batching --------------------------------------------------------
for shape in 1b 135m; do
    model=$M1B; [ "$shape" = 135m ] && model=$M135
    stage "throughput-$shape" 140 "$PY" benchmarks/throughput.py --model "$model" --device "$DEVICE" \
        --dtype "$DTYPE" --num-requests "$REQUESTS" --max-num-seqs "$SEQS" \
        --max-num-batched-tokens "$TOKENS" --kv-cache-mib 0 --hf-batch-size 64 \
        --hf-num-requests "$HF_REQUESTS" --json "$WORK/json/throughput-$shape.json"
done

# -- kernels ---------------------------------------------------------------------------------
stage kernels 120 "$PY" benchmarks/bench_kernels.py --quick --json "$WORK/json/kernels.json"

# -- LoRA: the segmented gather matmul on CUDA against its torch references ---------------------
stage lora 60 "$PY" -m pytest -q -p no:cacheprovider -x tests/kernels/test_lora.py

# -- quantized GEMMs and decode steps ------------------------------------------------------------
if [ "$SMOKE" = 1 ]; then
    stage quant-tests 120 env TRITON_INTERPRET=1 "$PY" -m pytest -q -p no:cacheprovider \
        tests/kernels/test_quant_matmul.py -k "w8a16 and dtype0 and 1-96-192"
    stage quant 120 "$PY" benchmarks/bench_quant_gemm.py --smoke --quick --model-1b "$M1B" \
        --work "$WORK/models" --decode-batches 1,4 --decode-tokens 4 --json "$WORK/json/quant.json"
else
    stage quant-tests 90 "$PY" -m pytest -q -p no:cacheprovider -x tests/kernels/test_quant_matmul.py
    stage quant 150 "$PY" benchmarks/bench_quant_gemm.py --quick --model-1b "$M1B" \
        --work "$WORK/models" --decode-batches 1,64 --decode-tokens 32 --json "$WORK/json/quant.json"
fi

# -- structured outputs: the mask on the device, its cost per step -----------------------------------
if [ "$SMOKE" = 1 ]; then
    stage structured 120 "$PY" benchmarks/structured.py --model "$M135" --device "$DEVICE" \
        --dtype "$DTYPE" --batch-sizes 1,4 --steps 3 --skip-validity --json "$WORK/json/structured.json"
else
    stage structured 120 "$PY" benchmarks/structured.py --model "$M135" --device "$DEVICE" \
        --dtype "$DTYPE" --batch-sizes 1,32,64 --steps 30 --skip-validity \
        --json "$WORK/json/structured.json"
fi

# -- tensor-parallel plumbing at TP=1 ----------------------------------------------------------
if [ "$SMOKE" = 1 ]; then
    stage tp 120 "$PY" benchmarks/tensor_parallel.py --model "$M135" --device cpu --dtype float32 \
        --sizes 1,2 --num-requests 4 --prompt-len 16 --max-tokens 4 --rounds 1 \
        --json "$WORK/json/tensor-parallel.json"
else
    stage tp 100 "$PY" benchmarks/tensor_parallel.py --model "$M1B" --device cuda --dtype bfloat16 \
        --sizes 1 --cuda-graphs both --num-requests 32 --prompt-len 128 --max-tokens 64 --rounds 3 \
        --kv-cache-mib 4096 --json "$WORK/json/tensor-parallel.json"
fi

# -- speculative decoding: the verification step's cost, tok/s with and without ----------------
if [ "$SMOKE" = 1 ]; then
    stage spec-verify 120 "$PY" benchmarks/spec_verify.py --model "$M1B" --device "$DEVICE" \
        --dtype "$DTYPE" --batch-sizes 1,4 --k 4 --context 32 --steps 3 --kv-cache-mib 64 \
        --json "$WORK/json/spec-verify.json"
    stage spec-decode 120 "$PY" benchmarks/spec_decode.py --model "$M135" --device "$DEVICE" \
        --dtype "$DTYPE" --workloads repetitive --batches 1,4 --methods ngram,self --max-tokens 8 \
        --min-requests 4 --kv-cache-mib 64 --json "$WORK/json/spec-decode.json"
else
    stage spec-verify 100 "$PY" benchmarks/spec_verify.py --model "$M1B" --device "$DEVICE" \
        --dtype "$DTYPE" --batch-sizes 1,32 --k 4,8 --context 512 --steps 30 --kv-cache-mib 4096 \
        --json "$WORK/json/spec-verify.json"
    stage spec-decode 120 "$PY" benchmarks/spec_decode.py --model "$M1B" --device "$DEVICE" \
        --dtype "$DTYPE" --workloads repetitive --batches 1,32 --methods ngram,self --k 4 \
        --threshold 0 --max-tokens 64 --min-requests 32 --kv-cache-mib 4096 \
        --json "$WORK/json/spec-decode.json"
fi

# -- 8-bit KV cache: the Triton kernels on int8 / fp8 caches vs bf16 (GPU only) --------------------
stage kv8 90 "$PY" benchmarks/bench_kernels.py --quick --kv-only --kv-cache-dtypes int8,fp8 \
    --json "$WORK/json/kv8.json"

# -- model families: exact on the GPU, real shapes through the throughput benchmark --------------
if [ "$SMOKE" = 1 ]; then
    FAMILY_DTYPES="float32" FAMILY_LAYERS=${FAMILY_LAYERS:-2} FAMILY_SHAPE=--tiny
    FAMILY_PRESETS=${FAMILY_PRESETS:-llama-3.1-8b qwen2.5-7b qwen3-8b mistral-7b gemma-3-4b phi-3-mini}
    FAMILY_REQUESTS=8 FAMILY_HF_REQUESTS=4 FAMILY_SEQS=8 FAMILY_TOKENS=512
else
    FAMILY_DTYPES="float32 bfloat16"
    FAMILY_PRESETS=${FAMILY_PRESETS:-llama-3.1-8b qwen2.5-7b qwen3-8b mistral-7b gemma-3-4b phi-3-mini}
    FAMILY_LAYERS=${FAMILY_LAYERS:-4} FAMILY_REQUESTS=256 FAMILY_HF_REQUESTS=64 FAMILY_SEQS=256
    FAMILY_TOKENS=8192 FAMILY_SHAPE=
fi
for dt in $FAMILY_DTYPES; do
    stage "families-exact-$dt" 150 env INFLIGHT_TEST_DEVICE="$DEVICE" INFLIGHT_TEST_DTYPE="$dt" \
        "$PY" -m pytest -q -p no:cacheprovider tests/engine/test_families.py
done
for preset in $FAMILY_PRESETS; do
    model=$WORK/models/family-$preset
    stage "family-$preset" 75 bash -c "'$PY' benchmarks/gpu/make_model.py '$model' '$TOK' --preset $preset \
            --layers $FAMILY_LAYERS --dtype $DTYPE $FAMILY_SHAPE && \
        '$PY' benchmarks/throughput.py --model '$model' --device $DEVICE --dtype $DTYPE \
            --num-requests $FAMILY_REQUESTS --max-num-seqs $FAMILY_SEQS \
            --max-num-batched-tokens $FAMILY_TOKENS --kv-cache-mib 0 --hf-batch-size 64 \
            --hf-num-requests $FAMILY_HF_REQUESTS --json '$WORK/json/family-$preset.json'; \
        rc=\$?; rm -rf '$model'; exit \$rc"
done

# -- summary -----------------------------------------------------------------------------------
"$PY" benchmarks/gpu/summarize.py "$WORK" "$OUT"
echo "GPU check done in $(( $(date +%s) - DEADLINE + BUDGET ))s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"

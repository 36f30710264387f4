"""Every model family: tokens identical to transformers, and engine tok/s vs transformers'
continuous batching (`generate_batch`), the same greedy requests in the same run.

    .venv/bin/python benchmarks/models.py [--models tiny,smollm2,gemma3] [--json out.json]

Models: each family's tiny random checkpoint (tests/tiny_families.py: 2 layers, hidden 64,
windows of 8-12 tokens) and the two bundled real models, SmolLM2-135M-Instruct and Gemma 3
270M (engine/bundled_models.py; converted once into the cache), fp32 on CPU.
Workload: `--requests` prompts (tiny: random ids, 20-90 tokens; real: windows of Python
docstring text, 16-64 tokens) x `--tokens` new tokens each, greedy, ignore_eos; tok/s =
generated tokens / wall time of the whole call on each side, after a warm-up call, and
per CPU-second of the process (the steadier figure on a shared, loaded machine).
The baseline is `model.generate_batch` (transformers' paged continuous batching) with a
KV cache like the engine's (16-token pages, the same block count and token budget: its
default sizes the cache from the machine's memory, which on CPU costs seconds a call);
where the installed transformers has no `generate_batch`, or it fails on a model, the
baseline is `generate` with static batches (left-padded), and the table says which.
"""

from __future__ import annotations

import random
import tempfile

from common import Timer, base_parser, machine_note, print_table, setup_torch, write_json

BLOCK, BUDGET, MAX_SEQS = 16, 512, 64


def tiny_prompts(n: int, seed: int) -> list[list[int]]:
    from tests.tiny_families import VOCAB

    rng = random.Random(seed)
    return [[rng.randrange(5, VOCAB) for _ in range(rng.randint(20, 90))] for _ in range(n)]


def text_prompts(path, n: int, seed: int) -> list[list[int]]:
    from inflight.engine.quant.calibration import docstring_text
    from inflight.engine.tokenizer import Tokenizer

    ids = Tokenizer(path).encode(docstring_text()[:200_000])
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(16, 64)
        start = rng.randrange(1, len(ids) - length)
        out.append(ids[:1] + ids[start:start + length - 1])  # the tokenizer's BOS, if any, first
    return out


def run_engine(path, prompts, tokens: int, dtype: str) -> tuple[list[list[int]], Timer]:
    from inflight.engine import Engine, EngineConfig, SamplingParams

    blocks = len(prompts) * (-(-(90 + tokens) // BLOCK)) + 8
    eng = Engine(EngineConfig(model=path, dtype=dtype, num_kv_blocks=blocks, block_size=BLOCK,
                              max_num_batched_tokens=BUDGET, max_num_seqs=MAX_SEQS,
                              enable_prefix_caching=False))
    greedy = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    eng.generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))  # warm up
    with Timer() as t:
        outs = eng.generate(prompts, greedy)
    return [o.token_ids for o in outs], t


def run_hf(path, prompts, tokens: int, dtype: str,
           default_cache: bool = False) -> tuple[list[list[int]], Timer, str]:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    gen = GenerationConfig(max_new_tokens=tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    if hasattr(model, "generate_batch"):
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        blocks = len(prompts) * (-(-(90 + tokens) // BLOCK)) + 8
        cb = None if default_cache else ContinuousBatchingConfig(
            page_size=BLOCK, num_blocks=blocks, max_batch_tokens=BUDGET, max_requests_per_batch=MAX_SEQS)
        try:
            with torch.inference_mode():
                model.generate_batch(prompts[:2], generation_config=GenerationConfig(
                    max_new_tokens=4, do_sample=False, eos_token_id=-1, pad_token_id=0),
                    continuous_batching_config=cb, warmup=False)
                with Timer() as t:
                    out = model.generate_batch(prompts, generation_config=gen,
                                               continuous_batching_config=cb, warmup=False)
            name = "generate_batch" + (" (default cache)" if default_cache else "")
            return [out[f"req_{i}"].generated_tokens for i in range(len(prompts))], t, name
        except Exception as exc:  # noqa: BLE001 - a model it cannot run: the static baseline
            print(f"  generate_batch failed on {path.name}: {type(exc).__name__}: {str(exc)[:200]}")
    return *static_generate(model, prompts, tokens), "generate (static batches)"


def static_generate(model, prompts, tokens: int, batch: int = 16):
    import torch

    outs: list[list[int]] = []
    with Timer() as t, torch.inference_mode():
        for s in range(0, len(prompts), batch):
            group = prompts[s:s + batch]
            width = max(map(len, group))
            ids = torch.tensor([[0] * (width - len(p)) + p for p in group])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
            out = model.generate(ids, attention_mask=mask, max_new_tokens=tokens, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
            outs += out[:, width:].tolist()
    return outs, t


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny,smollm2,gemma3",
                   help="comma list: tiny (every family), smollm2, gemma3, or family names")
    p.add_argument("--requests", type=int, default=None, help="default: tiny 32, real 48")
    p.add_argument("--tokens", type=int, default=None, help="default: tiny 32, real 48")
    p.add_argument("--hf-default-cache", action="store_true",
                   help="generate_batch with its own cache sizing (from the machine's memory)")
    args = p.parse_args()
    setup_torch(args.threads, args.seed)
    import pathlib

    from inflight.engine.model_folder import ensure_bundled_model
    from inflight.schemas import Settings
    from tests.tiny_families import FAMILIES, write_tiny_family

    wanted = args.models.split(",")
    models: list[tuple[str, pathlib.Path, bool]] = []
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-models-"))
    for name in FAMILIES:
        if "tiny" in wanted or name in wanted:
            models.append((f"tiny {name}", write_tiny_family(tmp / name, name), True))
    for key, bundled in (("smollm2", "smollm2-135m"), ("gemma3", "gemma3-270m")):
        if key in wanted:
            models.append((bundled, ensure_bundled_model(Settings().cache_dir, bundled), False))

    rows, results = [], []
    for label, path, tiny in models:
        n = args.requests or (32 if tiny else 48)
        tokens = args.tokens or (32 if tiny else 48)
        prompts = tiny_prompts(n, args.seed) if tiny else text_prompts(path, n, args.seed)
        ours, t_eng = run_engine(path, prompts, tokens, args.dtype)
        theirs, t_hf, baseline = run_hf(path, prompts, tokens, args.dtype, args.hf_default_cache)
        same = sum(a == b for a, b in zip(ours, theirs))
        same_tokens = sum(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
                          for a, b in zip(ours, theirs))
        total = n * tokens
        eng_tps, hf_tps = total / t_eng.elapsed, total / t_hf.elapsed
        r = dict(model=label, requests=n, tokens=tokens, identical_sequences=same,
                 identical_tokens=same_tokens, engine_tok_s=eng_tps, hf_tok_s=hf_tps,
                 engine_cpu_s=t_eng.cpu, hf_cpu_s=t_hf.cpu, baseline=baseline, ratio=eng_tps / hf_tps)
        results.append(r)
        r["engine_tok_cpu_s"], r["hf_tok_cpu_s"] = total / t_eng.cpu, total / t_hf.cpu
        rows.append((label, f"{n} x {tokens}", f"{same}/{n}", f"{same_tokens}/{total}",
                     eng_tps, hf_tps, f"{r['ratio']:.2f}x", r["engine_tok_cpu_s"], r["hf_tok_cpu_s"],
                     f"{r['engine_tok_cpu_s'] / r['hf_tok_cpu_s']:.2f}x", baseline))
        print(f"{label}: {same}/{n} identical, engine {eng_tps:.1f} tok/s, HF {hf_tps:.1f} tok/s ({baseline})",
              flush=True)
    print_table(f"Models vs transformers, {args.dtype}, {args.threads} thread(s), greedy ({machine_note()})",
                rows, ("model", "requests x tokens", "same sequences", "same tokens (prefix)",
                       "engine tok/s", "HF tok/s", "ratio", "engine tok/CPU-s", "HF tok/CPU-s",
                       "CPU ratio", "HF baseline"))
    write_json(args.json, {"machine": machine_note(), "threads": args.threads, "dtype": args.dtype,
                           "results": results})


if __name__ == "__main__":
    main()

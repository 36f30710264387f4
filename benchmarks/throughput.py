"""Throughput: this engine vs Hugging Face `generate()` with static batches, same workload.

    .venv/bin/python benchmarks/throughput.py [--json out.json] [--plot out.png]
    python benchmarks/throughput.py --device cuda --dtype bfloat16 --model DIR \
        --num-requests 2048 --max-num-seqs 256 --max-num-batched-tokens 8192 \
        --kv-cache-mib 0 --hf-batch-size 64 --hf-num-requests 512

Workload: 64 requests, prompt lengths uniform 16-256 tokens, output lengths
lognormal (median 48, clipped 8-256), greedy, ignore_eos, SmolLM2-135M fp32 on CPU. The
baseline pads each static batch on the left and runs it to its longest output; both sides
count only the tokens each request asked for. `--hf-num-requests N` runs the baseline on
the first N requests only (its tok/s hardly depends on how many batches it runs; a GPU
check has minutes, not the half hour HF needs for 2,048 requests). `--kv-cache-mib 0`
lets the engine size its KV cache (on CUDA: after a profiling step, engine/startup.py).
"""

from __future__ import annotations

import time

from common import (Timer, base_parser, lognormal_lengths, machine_note, model_path, print_table,
                    random_tokens, setup_torch, write_json)


def workload(n: int, seed: int, vocab: int):
    import random

    rng = random.Random(seed)
    prompts = [random_tokens(rng, rng.randint(16, 256), vocab) for _ in range(n)]
    outputs = lognormal_lengths(rng, n, median=48, sigma=0.8, lo=8, hi=256)
    return prompts, outputs


def run_engine(path, prompts, outputs, args) -> dict:
    from inflight.engine import Engine, EngineConfig, SamplingParams

    eng = Engine(EngineConfig(model=path, dtype=args.dtype, device=args.device,
                              max_num_seqs=args.max_num_seqs,
                              max_num_batched_tokens=args.max_num_batched_tokens,
                              kv_cache_bytes=(args.kv_cache_mib << 20) or None,
                              enable_prefix_caching=False, seed=args.seed))
    eng.generate([prompts[0][:32]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))  # warm up
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in outputs]
    steps, peak_blocks, waste, used_samples, t_series = 0, 0, [], [], []
    finals = {}
    with Timer() as t:
        for i, (p, sp) in enumerate(zip(prompts, params)):
            eng.add_request(str(i), prompt_token_ids=p, params=sp)
        start = time.perf_counter()
        while eng.has_unfinished():
            for out in eng.step():
                if out.finished:
                    finals[out.request_id] = out
            steps += 1
            if steps % args.stats_every:
                continue
            s = eng.stats()
            peak_blocks = max(peak_blocks, s["kv_blocks_used"])
            if s["kv_blocks_used"]:
                waste.append(s["kv_waste"])
            used_samples.append(s["kv_blocks_used"])
            t_series.append(time.perf_counter() - start)
    out_tokens = sum(len(f.token_ids) for f in finals.values())
    assert out_tokens == sum(outputs), (out_tokens, sum(outputs))
    ttft = sorted(f.first_token_time - f.arrival_time for f in finals.values())
    return {"wall_s": t.elapsed, "output_tokens": out_tokens, "tok_s": out_tokens / t.elapsed,
            "cpu_s": t.cpu, "tok_per_cpu_s": out_tokens / t.cpu, "steps": steps, "kv_blocks_total": eng.num_kv_blocks, "kv_blocks_peak": peak_blocks,
            "kv_waste_mean": sum(waste) / len(waste) if waste else 0.0, "kv_waste_max": max(waste, default=0.0),
            "preemptions": eng.stats()["preemptions"], "ttft_p50_s": ttft[len(ttft) // 2],
            "kv_blocks_used_series": used_samples, "time_series": t_series}


def run_hf(path, prompts, outputs, args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(args.device).eval()
    pad = 0

    def batch_generate(batch_prompts, max_new):
        width = max(map(len, batch_prompts))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch_prompts], device=args.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch_prompts], device=args.device)
        with torch.inference_mode():
            return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new,
                                  min_new_tokens=max_new, do_sample=False, pad_token_id=pad,
                                  eos_token_id=None)

    batch_generate([prompts[0][:32]], 4)  # warm up
    bs = args.hf_batch_size
    out_tokens = 0
    with Timer() as t:
        for i in range(0, len(prompts), bs):
            batch, lens = prompts[i:i + bs], outputs[i:i + bs]
            gen = batch_generate(batch, max(lens))
            out_tokens += sum(min(L, gen.shape[1] - max(map(len, batch))) for L in lens)
    assert out_tokens == sum(outputs)
    return {"wall_s": t.elapsed, "output_tokens": out_tokens, "tok_s": out_tokens / t.elapsed,
            "cpu_s": t.cpu, "tok_per_cpu_s": out_tokens / t.cpu, "batch_size": bs,
            "requests": len(prompts)}


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--kv-cache-mib", type=int, default=1024)
    p.add_argument("--hf-batch-size", type=int, default=16)
    p.add_argument("--hf-num-requests", type=int, default=None,
                   help="run the baseline on the first N requests only (default: all)")
    p.add_argument("--stats-every", type=int, default=None,
                   help="sample engine stats (KV use) every N steps (default 1 on CPU, 16 on CUDA)")
    p.add_argument("--skip-hf", action="store_true")
    args = p.parse_args()
    if args.stats_every is None:
        args.stats_every = 16 if args.device.startswith("cuda") else 1
    setup_torch(args.threads, args.seed)
    import json

    path = model_path(args.model)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    prompts, outputs = workload(args.num_requests, args.seed, vocab)
    print(f"model {path.name}, {args.dtype} on {args.device}, {args.threads} threads; "
          f"{len(prompts)} requests, prompt tokens {sum(map(len, prompts))}, "
          f"output tokens {sum(outputs)} (max {max(outputs)})", flush=True)
    print("running the engine ...", flush=True)
    eng = run_engine(path, prompts, outputs, args)
    print(f"  engine: {eng['wall_s']:.1f}s, {eng['tok_s']:.1f} output tok/s", flush=True)
    if args.device.startswith("cuda"):  # the engine's KV cache took most of the GPU
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()
    hf = None
    if not args.skip_hf:
        print(f"running HF generate, static batches of {args.hf_batch_size} ...", flush=True)
        k = args.hf_num_requests or len(prompts)
        hf = run_hf(path, prompts[:k], outputs[:k], args)
    rows = [("engine (in-flight, paged)", len(prompts), eng["output_tokens"], eng["wall_s"], eng["tok_s"],
             eng["cpu_s"], eng["tok_per_cpu_s"],
             f"{eng['kv_blocks_peak']}/{eng['kv_blocks_total']}",
             f"{eng['kv_waste_mean']:.2%} (max {eng['kv_waste_max']:.2%})")]
    if hf:
        rows.append((f"HF generate, static batch {hf['batch_size']}", hf["requests"], hf["output_tokens"],
                     hf["wall_s"], hf["tok_s"], hf["cpu_s"], hf["tok_per_cpu_s"], "-", "-"))
    print_table("Throughput (issue 3 workload)", rows,
                ("system", "requests", "output tokens", "wall s", "output tok/s", "CPU s",
                 "output tok/CPU s", "KV blocks peak", "KV waste"))
    ratio = eng["tok_s"] / hf["tok_s"] if hf else float("nan")
    cpu_ratio = eng["tok_per_cpu_s"] / hf["tok_per_cpu_s"] if hf else float("nan")
    if hf:
        print(f"\nengine / HF static batching: {ratio:.2f}x output tokens/s (wall), "
              f"{cpu_ratio:.2f}x output tokens per CPU second")
    print(f"engine steps {eng['steps']}, preemptions {eng['preemptions']}, TTFT p50 {eng['ttft_p50_s']:.2f}s; "
          f"{machine_note()}")
    write_json(args.json, {"args": vars(args), "engine": {k: v for k, v in eng.items() if not k.endswith("series")},
                           "hf": hf, "ratio": ratio, "cpu_ratio": cpu_ratio, "machine": machine_note()})
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
        names = ["engine"] + (["HF static"] if hf else [])
        a1.bar(names, [eng["tok_s"]] + ([hf["tok_s"]] if hf else []), color=["tab:blue", "tab:gray"][:len(names)])
        a1.set_ylabel("output tokens / s")
        a1.set_title(f"throughput ({ratio:.2f}x)")
        a2.plot(eng["time_series"], eng["kv_blocks_used_series"])
        a2.set_xlabel("s")
        a2.set_ylabel("KV blocks used")
        a2.set_title("engine KV blocks over the run")
        fig.tight_layout()
        fig.savefig(args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()

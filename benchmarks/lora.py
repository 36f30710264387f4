"""Multi-LoRA serving on CPU: 32 concurrent requests over 0, 1, 4 and 16 distinct rank-16
adapters on SmolLM2-135M (adapters of every linear projection, random weights built by
`peft`), against the base model alone in the same run.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/lora.py --threads 2 --plot docs/img/lora.png

Rows:
- `base engine`: an engine without adapter slots (max_loras=0): the baseline.
- `0 adapters`: the engine with 16 slots loaded, every request on the base model (what the
  slots cost when unused: nothing in the forward).
- `N adapters`: the 32 requests spread round-robin over N adapters (all resident).
Each row: output tok/s (wall), its overhead against the baseline, and CPU seconds. Then the
adapter load time (folder read and checked; copy into a slot) and memory per adapter (the
slot tensors, which hold max_lora_rank columns per sub-projection; and the adapter's own
weights on the host).
"""

from __future__ import annotations

import pathlib
import random
import tempfile
import time

from common import Timer, base_parser, machine_note, model_path, print_table, random_tokens, setup_torch, write_json

ADAPTER_COUNTS = (0, 1, 4, 16)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_adapters(base: pathlib.Path, n: int, rank: int, out: pathlib.Path) -> list[pathlib.Path]:
    """n random peft adapters (kept in `out` between runs: building them is not measured)."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.lora_adapters import write_peft_adapter

    paths = [out / f"a{i}" for i in range(n)]
    missing = [p for p in paths if not (p / "adapter_model.safetensors").is_file()]
    if missing:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        for p in missing:
            write_peft_adapter(p, base, base_model=model, r=rank, lora_alpha=2 * rank,
                               target_modules=TARGETS, seed=int(p.name[1:]), b_scale=1.0)
    return paths


def run(engine, prompts, loras, max_tokens) -> dict:
    from inflight.engine import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, (p, lora) in enumerate(zip(prompts, loras)):
        engine.add_request(f"r{time.monotonic_ns()}-{i}", prompt_token_ids=p, params=params, lora=lora)
    tokens = 0
    with Timer() as t:
        while engine.has_unfinished():
            for out in engine.step():
                tokens += len(out.new_token_ids)
    print(f"  {sum(1 for x in loras if x)} adapter requests / {len(loras)}: {tokens} tokens in "
          f"{t.elapsed:.1f}s", flush=True)
    return {"tokens": tokens, "wall_s": t.elapsed, "cpu_s": t.cpu, "tok_s": tokens / t.elapsed}


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.set_defaults(num_requests=32)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--rank", type=int, default=16)
    args = p.parse_args()
    setup_torch(args.threads, args.seed)
    from inflight.engine import Engine, EngineConfig

    base = model_path(args.model)
    tmp = pathlib.Path(tempfile.gettempdir()) / "inflight-lora-bench" / f"{base.name}-r{args.rank}"
    t0 = time.perf_counter()
    paths = build_adapters(base, max(ADAPTER_COUNTS), args.rank, tmp)
    print(f"built {len(paths)} rank-{args.rank} peft adapters in {time.perf_counter() - t0:.1f}s")
    rng = random.Random(args.seed)
    n = args.num_requests

    def prompts():  # fresh tokens each run: no prefix-cache hits across runs
        return [random_tokens(rng, args.prompt_len, 49152) for _ in range(n)]

    common = dict(model=str(base), dtype=args.dtype, device=args.device, max_num_seqs=n,
                  kv_cache_bytes=256 << 20, enable_prefix_caching=False)
    baseline = Engine(EngineConfig(**common))
    run(baseline, prompts()[:4], [None] * 4, 4)  # warm-up
    rows, results = [], {}
    base_run = run(baseline, prompts(), [None] * n, args.max_tokens)
    results["base engine"] = base_run
    del baseline
    engine = Engine(EngineConfig(**common, max_loras=max(ADAPTER_COUNTS), max_lora_rank=args.rank))
    read_s = []
    for i, path in enumerate(paths):
        t = time.perf_counter()
        adapter = engine.add_lora(f"a{i}", path)
        read_s.append(time.perf_counter() - t)
    names = [f"a{i}" for i in range(len(paths))]
    run(engine, prompts()[:16], names[:16], 2)  # warm-up; loads all 16 into their slots
    slot_s = engine.lora.take_load_seconds()
    for k in ADAPTER_COUNTS:
        loras = [None] * n if k == 0 else [names[i % k] for i in range(n)]
        results[f"{k} adapters"] = run(engine, prompts(), loras, args.max_tokens)
    for label, r in results.items():
        rows.append((label, r["tokens"], r["wall_s"], r["tok_s"],
                     f"{100 * (base_run['tok_s'] / r['tok_s'] - 1):+.1f}%", r["cpu_s"]))
    print_table(f"{n} concurrent requests, prompt {args.prompt_len}, {args.max_tokens} output tokens, "
                f"rank-{args.rank} adapters of q/k/v/o/gate/up/down, SmolLM2-135M {args.dtype} on "
                f"{args.device}, {args.threads} thread(s)", rows,
                ("run", "tokens", "wall s", "out tok/s", "time vs base", "cpu s"))
    slot_bytes = engine.lora.slots.bytes_per_slot
    load = [("read + check (add_lora)", 1000 * sum(read_s) / len(read_s), max(read_s) * 1000),
            ("copy into a slot", 1000 * sum(slot_s) / max(1, len(slot_s)), 1000 * max(slot_s or [0]))]
    print_table("adapter load time (ms)", load, ("step", "mean", "max"))
    mem = [("slot tensors per adapter (max_lora_rank columns)", slot_bytes / 2**20),
           ("adapter weights (its own rank)", adapter.nbytes / 2**20)]
    print_table("memory per resident adapter (MiB)", mem, ("what", "MiB"))
    print(machine_note())
    write_json(args.json, {"runs": results, "read_s": read_s, "slot_s": slot_s,
                           "slot_bytes": slot_bytes, "adapter_bytes": adapter.nbytes})
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.8))
        labels = list(results)
        ax.bar(labels, [results[k]["tok_s"] for k in labels], color=["gray"] + ["tab:blue"] * (len(labels) - 1))
        for i, k in enumerate(labels):
            ax.text(i, results[k]["tok_s"], f"{results[k]['tok_s']:.0f}", ha="center", va="bottom")
        ax.set_ylabel("output tok/s")
        ax.set_title(f"{n} concurrent requests over N rank-{args.rank} LoRA adapters (SmolLM2-135M, CPU)")
        fig.tight_layout()
        fig.savefig(args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()

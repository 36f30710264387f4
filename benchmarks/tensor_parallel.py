"""Tensor parallelism: the same requests at TP=1 (one process), TP=1 through the tensor-
parallel code path, and TP=2 (two processes, gloo on the CPU), in one run.

    .venv/bin/python benchmarks/tensor_parallel.py [--tiny] [--shape-135m] [--sizes 1,2,3] [--json out.json]
    # on a GPU (one device: TP=1 only, the plumbing's overhead):
    python benchmarks/tensor_parallel.py --device cuda --dtype bfloat16 --sizes 1 --cuda-graphs both

Models: the default (SmolLM2-135M: 9 heads, 3 KV heads, so TP=3, not 2), `--tiny` (4 layers,
256 wide) and `--shape-135m` (SmolLM2-135M's size with 8 heads: TP=2). A size a model's
heads do not divide is skipped, saying so.

Configurations: `uni` is the plain engine (EngineConfig.distributed_executor_backend
"uni"); `mp@1` runs the sharded model over one rank (`"mp"` at size 1: every hook of the
tensor-parallel path, no other process, collectives skipped), so `mp@1 - uni` is what the
plumbing costs a step; `mp@N` shards over N processes. Each configuration's engine is
built once; the workload (N prompts of L random tokens, M greedy tokens each, all at
once) runs `--rounds` times, configurations interleaved, and each figure is the median
over rounds of the per-round median. Step times are host wall time per `engine.step()`:
decode steps (no prefill token in the step) and steps with prefill apart, and rank 0's CPU
time per decode step (on a loaded box the steadier figure; it leaves out the followers'
CPU). All-reduce,
broadcast and gather times are rank 0's, per step (gloo calls are synchronous: the time
includes waiting for the slower rank). Tokens are compared with `uni`'s (greedy).

CPU threads: `--threads` torch threads per rank (OMP_NUM_THREADS for the followers), so
TP=2 uses twice the cores of TP=1; on this 2-core box shared with other work, compare the
CPU columns too.
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time

from common import base_parser, machine_note, model_path, print_table, random_tokens, setup_torch, write_json


def config_name(backend: str, size: int, graphs: bool | None) -> str:
    name = "uni" if backend == "uni" else f"mp@{size}"
    return name if graphs is None else f"{name} graphs={'on' if graphs else 'off'}"


def build(path, backend: str, size: int, graphs: bool | None, args):
    from inflight.engine import Engine, EngineConfig

    cfg = EngineConfig(model=str(path), dtype=args.dtype, device=args.device, seed=args.seed,
                       tensor_parallel_size=size, distributed_executor_backend=backend,
                       max_num_seqs=max(args.num_requests, 1), kv_cache_bytes=args.kv_cache_mib << 20,
                       max_num_batched_tokens=args.max_num_batched_tokens, cuda_graphs=graphs)
    return Engine(cfg)


def workload(args, vocab: int) -> list[list[int]]:
    rng = random.Random(args.seed)
    return [random_tokens(rng, args.prompt_len, vocab, low=min(100, vocab // 2))
            for _ in range(args.num_requests)]


def one_round(eng, prompts, args) -> dict:
    import torch

    from inflight.engine import SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    group = eng.parallel.group if eng.parallel is not None else None
    if group is not None:
        group.reset_comm()
    decode, decode_cpu, prefill, finals = [], [], [], {}
    for i, p in enumerate(prompts):
        eng.add_request(str(i), prompt_token_ids=p, params=params)
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    while eng.has_unfinished():
        t0, c0 = time.perf_counter(), time.process_time()
        outs = eng.step()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if eng.counters.last_prefill_tokens:
            prefill.append(dt)
        else:
            decode.append(dt)
            decode_cpu.append(dc)
        for o in outs:
            if o.finished:
                finals[o.request_id] = o.token_ids
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    steps = len(decode) + len(prefill)
    comm = {k: (c[0] / steps, c[1] / steps * 1e3) for k, c in group.comm.items()} if group else {}
    return {"tokens": [finals[str(i)] for i in range(len(prompts))],
            "decode_ms": statistics.median(decode) * 1e3 if decode else float("nan"),
            "decode_cpu_ms": statistics.median(decode_cpu) * 1e3 if decode else float("nan"),
            "prefill_ms": statistics.median(prefill) * 1e3 if prefill else float("nan"),
            "wall_s": time.perf_counter() - wall0, "cpu_s": time.process_time() - cpu0, "steps": steps,
            "comm": comm}


def shardable(path, size: int) -> str | None:
    """Why the model does not shard over `size` ranks (None: it does)."""
    from inflight.engine.errors import ConfigError
    from inflight.engine.model_config import ModelConfig
    from inflight.engine.parallel.shard import ShardPlan

    try:
        ShardPlan.of(ModelConfig.from_folder(path), 0, size)
    except ConfigError as exc:
        return str(exc)
    return None


def bench_model(label: str, path, args) -> list[dict]:
    configs = []
    graph_modes = {"on": [True], "off": [False], "both": [True, False], "default": [None]}[args.cuda_graphs]
    sizes = []
    for size in args.sizes:
        why = shardable(path, size)
        if why:
            print(f"({label}: TP={size} skipped: {why})")
        else:
            sizes.append(size)
    for size in sizes:
        for graphs in graph_modes:
            if size == 1:
                configs.append(("uni", 1, graphs))
            configs.append(("mp", size, graphs))
    engines = {c: build(path, *c, args) for c in configs}
    try:
        vocab = next(iter(engines.values())).model.config.vocab_size
        prompts = workload(args, vocab)
        for eng in engines.values():  # warm-up: first-call costs out of the figures
            one_round(eng, prompts[:2], args)
        rounds: dict = {c: [] for c in configs}
        for _ in range(args.rounds):
            for c, eng in engines.items():
                rounds[c].append(one_round(eng, prompts, args))
    finally:
        for eng in engines.values():
            eng.close()
    ref = {g: rounds[("uni", 1, g)][0]["tokens"] for g in graph_modes if ("uni", 1, g) in rounds}
    rows = []
    for c in configs:
        rs = rounds[c]
        med = lambda key: statistics.median(r[key] for r in rs)  # noqa: E731
        comm = {k: tuple(statistics.median(r["comm"][k][i] for r in rs) for i in (0, 1))
                for k in (rs[0]["comm"] or {})}
        base = ref.get(c[2])
        rows.append({"model": label, "config": config_name(*c), "size": c[1],
                     "tokens_identical": None if base is None else all(r["tokens"] == base for r in rs),
                     "decode_ms": med("decode_ms"), "decode_cpu_ms": med("decode_cpu_ms"),
                     "prefill_ms": med("prefill_ms"),
                     "wall_s": med("wall_s"), "cpu_s": med("cpu_s"), "steps": rs[0]["steps"],
                     "all_reduce_per_step": comm.get("all_reduce", (0, 0))[0],
                     "all_reduce_ms_per_step": comm.get("all_reduce", (0, 0.0))[1],
                     "broadcast_ms_per_step": comm.get("broadcast", (0, 0.0))[1],
                     "gather_ms_per_step": comm.get("gather", (0, 0.0))[1]})
    for g in graph_modes:  # the plumbing's cost at TP=1, per step
        uni = next((r for r in rows if r["config"] == config_name("uni", 1, g)), None)
        mp1 = next((r for r in rows if r["config"] == config_name("mp", 1, g)), None)
        if uni and mp1:
            mp1["plumbing_decode_ms"] = mp1["decode_ms"] - uni["decode_ms"]
            mp1["plumbing_decode_cpu_ms"] = mp1["decode_cpu_ms"] - uni["decode_cpu_ms"]
    return rows


def tiny_model(folder) -> str:
    from tests.tiny_llama import write_tiny_llama

    return str(write_tiny_llama(folder, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4,
                                intermediate_size=1024, max_position_embeddings=1024))


def shape_135m(folder) -> str:
    """SmolLM2-135M's size (30 layers, 576 wide, MLP 1536, 49,152 tokens) with 8 heads and 4
    KV heads instead of 9 and 3, so that it shards over 2 ranks (random weights)."""
    import json

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.tiny_llama import build_tokenizer

    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=72,
                      max_position_embeddings=2048, tie_word_embeddings=True, bos_token_id=2,
                      eos_token_id=1, pad_token_id=0, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
    build_tokenizer(320).save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "</s>", "bos_token": "<s>"}, f)
    return str(folder)


def main() -> None:
    p = base_parser(__doc__.split("\n\n")[0])
    p.set_defaults(num_requests=8)
    p.add_argument("--sizes", default="1,2", help="tensor-parallel sizes (1 runs uni and mp@1)")
    p.add_argument("--tiny", action="store_true", help="also a tiny random model (4 layers, 256 wide)")
    p.add_argument("--shape-135m", action="store_true",
                   help="also a random model of SmolLM2-135M's size with 8 heads (it shards over 2)")
    p.add_argument("--no-default", action="store_true", help="skip the default (bundled) model")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--kv-cache-mib", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cuda-graphs", choices=["on", "off", "both", "default"], default="default")
    args = p.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the followers' torch threads
    setup_torch(args.threads, args.seed)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.tiny:
            rows += bench_model("tiny", tiny_model(os.path.join(tmp, "tiny")), args)
        if args.shape_135m:
            rows += bench_model("135m-shape", shape_135m(os.path.join(tmp, "shape")), args)
        if not args.no_default:
            rows += bench_model("default" if not args.model else os.path.basename(args.model.rstrip("/")),
                                model_path(args.model), args)
    print_table(f"tensor parallelism: {args.num_requests} requests x {args.prompt_len} prompt + "
                f"{args.max_tokens} greedy tokens, {args.dtype} on {args.device}, {args.threads} "
                f"thread(s) per rank, median of {args.rounds} rounds",
                [(r["model"], r["config"], r["tokens_identical"], r["decode_ms"], r["decode_cpu_ms"],
                  r["prefill_ms"], r.get("plumbing_decode_ms", float("nan")),
                  r.get("plumbing_decode_cpu_ms", float("nan")), r["all_reduce_per_step"],
                  r["all_reduce_ms_per_step"], r["broadcast_ms_per_step"], r["gather_ms_per_step"],
                  r["wall_s"], r["cpu_s"]) for r in rows],
                ("model", "config", "tokens = uni", "decode ms/step", "decode CPU ms/step",
                 "prefill ms/step", "plumbing ms/step", "plumbing CPU ms/step", "all-reduces/step",
                 "all-reduce ms/step", "broadcast ms/step", "gather ms/step", "wall s", "rank-0 CPU s"))
    print(f"\n{machine_note()}")
    write_json(args.json, {"args": vars(args), "results": rows, "machine": machine_note()})


if __name__ == "__main__":
    main()

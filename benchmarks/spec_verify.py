"""What a speculative verification step costs against a plain decode step, same batch.

    python benchmarks/spec_verify.py --model DIR --device cuda --dtype bfloat16 --batch-sizes 1,32 --k 4,8

For each batch size B: B requests with a --context-token prompt each are prefilled, then
the model runner runs (a) the plain decode step as the engine runs it (CUDA graphs when
they are on: the padded path), (b) the same step eagerly, and (c) verification steps with
k drafts per request (1 + k tokens each, one forward, rejection sampling / greedy
acceptance included), --steps times each, interleaved; the median time of each, with
the device synchronised around every step. Nothing is accepted or appended: the same
step is measured again and again (the drafts are fixed tokens, the figures do not depend
on them). Beside the wall median, the least CPU time (this thread's) of each: on a CPU
shared with other work the steadier figure. The issue's GPU target: verification at batch 1, k = 4, on the 1B shape costs
<= 1.3x a plain decode step.
"""

from __future__ import annotations

import statistics
import time

from common import base_parser, machine_note, model_path, print_table, setup_torch, write_json


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", default="1,32")
    p.add_argument("--k", default="4,8", help="drafts per request to verify")
    p.add_argument("--context", type=int, default=512, help="prompt tokens per request")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--kv-cache-mib", type=int, default=2048)
    args = p.parse_args()
    setup_torch(args.threads, args.seed)
    import torch

    from inflight.engine import Engine, EngineConfig, SamplingParams
    from inflight.engine.scheduler import SchedulerOutput

    path = model_path(args.model)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    ks = [int(k) for k in args.k.split(",")]
    eng = Engine(EngineConfig(model=path, dtype=args.dtype, device=args.device, max_num_seqs=max(batches),
                              kv_cache_bytes=args.kv_cache_mib << 20, seed=args.seed,
                              overlap_outputs=False))
    cuda = eng.device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(eng.device)) if cuda else (lambda: None)
    vocab = eng.model.config.vocab_size
    params = SamplingParams(max_tokens=max(ks) + 8, temperature=0.0, ignore_eos=True)
    rows, results = [], []
    for B in batches:
        for i in range(B):
            prompt = [(7 * i + 13 * t) % (vocab - 200) + 100 for t in range(args.context)]
            eng.add_request(f"b{B}-{i}", prompt_token_ids=prompt, params=params)
        while any(r.num_output_tokens == 0 for r in eng.requests.values()):
            eng.step()  # prefill (and the first token of each)
        reqs = list(eng.scheduler.running)
        for r in reqs:
            assert eng.kv.allocate_slots(r, 1 + max(ks)), "KV cache too small: raise --kv-cache-mib"
        graphs = eng.runner.graphs

        def step(k: int, eager: bool = False) -> float:
            sched = SchedulerOutput(requests=reqs, num_tokens=[1 + k] * len(reqs),
                                    spec_token_ids={r: [101] * k for r in reqs} if k else {})
            saved = eng.runner.graphs
            if eager:
                eng.runner.graphs = None
            try:
                sync()
                t0, c0 = time.perf_counter(), time.thread_time()
                eng.runner.execute(sched)
                sync()
                return time.perf_counter() - t0, time.thread_time() - c0
            finally:
                eng.runner.graphs = saved

        kinds = [("plain", 0, False)] + ([("plain eager", 0, True)] if graphs is not None else []) + \
            [(f"verify k={k}", k, False) for k in ks]
        for name, k, eager in kinds:  # warm-up (Triton compiles, allocator)
            step(k, eager)
            step(k, eager)
        times = {name: [] for name, _, _ in kinds}
        cpu = {name: [] for name, _, _ in kinds}
        for _ in range(args.steps):
            for name, k, eager in kinds:
                wall_s, cpu_s = step(k, eager)
                times[name].append(wall_s)
                cpu[name].append(cpu_s)
        base, base_cpu = statistics.median(times["plain"]), min(cpu["plain"])
        for name, k, eager in kinds:
            med, least = statistics.median(times[name]), min(cpu[name])
            rows.append((B, name, 1 + k, med * 1e3, f"{med / base:.2f}x", least * 1e3,
                         f"{least / base_cpu:.2f}x"))
            results.append({"batch": B, "kind": name, "k": k, "tokens_per_request": 1 + k,
                            "median_ms": med * 1e3, "vs_plain": med / base,
                            "min_cpu_ms": least * 1e3, "vs_plain_cpu": least / base_cpu})
        for r in reqs:
            eng.abort(r.request_id)
        eng.step()
    print_table(f"verification vs plain decode ({path.name}, {args.dtype} on {args.device}, "
                f"context {args.context})", rows, ("batch", "step", "tokens/request", "median ms", "vs plain",
                                                "min CPU ms", "vs plain CPU"))
    print(machine_note())
    write_json(args.json, {"results": results, "machine": machine_note(), "args": vars(args)})


if __name__ == "__main__":
    main()

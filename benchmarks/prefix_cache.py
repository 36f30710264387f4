"""Prefix caching: the same requests with caching on and off, in one run.

    .venv/bin/python benchmarks/prefix_cache.py [--json out.json] [--plot out.png]

Workload 1: 64 requests sharing one 512-token system prompt, each followed by a
distinct 32-128-token question, 64 output tokens each (greedy, ignore_eos), all submitted
at once. Workload 2: the same shape with no shared prefix, to show what caching costs when
nothing hits. Time to first token counts from submission, so it includes queueing.
"""

from __future__ import annotations

import random

from common import (Timer, base_parser, machine_note, model_path, percentile, print_table,
                    random_tokens, setup_torch, write_json)


def shared_workload(n, seed, vocab, system_len=512, q_lo=32, q_hi=128):
    rng = random.Random(seed)
    system = random_tokens(rng, system_len, vocab)
    return [system + random_tokens(rng, rng.randint(q_lo, q_hi), vocab) for _ in range(n)]


def distinct_workload(n, seed, vocab, lo, hi):
    rng = random.Random(seed + 1)
    return [random_tokens(rng, rng.randint(lo, hi), vocab) for _ in range(n)]


def run(path, prompts, max_tokens, caching, args) -> dict:
    from inflight.engine import Engine, EngineConfig, SamplingParams

    eng = Engine(EngineConfig(model=path, dtype=args.dtype, device=args.device,
                              enable_prefix_caching=caching, max_num_seqs=args.max_num_seqs,
                              max_num_batched_tokens=args.max_num_batched_tokens,
                              kv_cache_bytes=args.kv_cache_mib << 20, seed=args.seed))
    warm = random_tokens(random.Random(99), 40, eng.model.config.vocab_size)
    eng.generate([warm], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    base = eng.stats()
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    finals = {}
    with Timer() as t:
        for i, p in enumerate(prompts):
            eng.add_request(str(i), prompt_token_ids=p, params=params)
        while eng.has_unfinished():
            for out in eng.step():
                if out.finished:
                    finals[out.request_id] = out
    s = eng.stats()
    outs = [finals[str(i)] for i in range(len(prompts))]
    ttft = [o.first_token_time - o.arrival_time for o in outs]
    queried = s["prefix_cache_queries"] - base["prefix_cache_queries"]
    hits = s["prefix_cache_hit_tokens"] - base["prefix_cache_hit_tokens"]
    out_tokens = sum(len(o.token_ids) for o in outs)
    return {"caching": caching, "wall_s": t.elapsed, "output_tokens": out_tokens,
            "tok_s": out_tokens / t.elapsed, "cpu_s": t.cpu, "tok_per_cpu_s": out_tokens / t.cpu,
            "prefill_tokens_computed": s["prefill_tokens"] - base["prefill_tokens"],
            "prompt_tokens": sum(map(len, prompts)), "hit_tokens": hits,
            "hit_rate": hits / queried if queried else 0.0,
            "ttft_p50_s": percentile(ttft, 50), "ttft_p90_s": percentile(ttft, 90),
            "cached_blocks": s["prefix_cache_blocks"], "evictions": s["prefix_cache_evictions"],
            "token_ids": [o.token_ids for o in outs], "ttft": ttft}


def table(title, on, off):
    rows = [(name, r["prefill_tokens_computed"], f"{r['hit_rate']:.1%}", r["ttft_p50_s"], r["ttft_p90_s"],
             r["tok_s"], r["wall_s"], r["cpu_s"]) for name, r in (("caching on", on), ("caching off", off))]
    rows.append(("off / on", f"{off['prefill_tokens_computed'] / max(on['prefill_tokens_computed'], 1):.2f}x",
                 "", f"{off['ttft_p50_s'] / on['ttft_p50_s']:.2f}x", f"{off['ttft_p90_s'] / on['ttft_p90_s']:.2f}x",
                 f"{off['tok_s'] / on['tok_s']:.3f}x", f"{off['wall_s'] / on['wall_s']:.2f}x",
                 f"{off['cpu_s'] / on['cpu_s']:.2f}x"))
    print_table(title, rows, ("", "prefill tokens computed", "hit rate", "TTFT p50 s", "TTFT p90 s",
                              "output tok/s", "total s", "CPU s"))


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--system-len", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--kv-cache-mib", type=int, default=2048)
    p.add_argument("--no-share-requests", type=int, default=32,
                   help="requests in the no-sharing workload (each run twice, interleaved)")
    p.add_argument("--skip-no-share", action="store_true")
    args = p.parse_args()
    setup_torch(args.threads, args.seed)
    import json

    path = model_path(args.model)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    prompts = shared_workload(args.num_requests, args.seed, vocab, args.system_len)
    print(f"model {path.name}, {args.dtype} on {args.device}, {args.threads} threads; shared workload: "
          f"{len(prompts)} requests, {sum(map(len, prompts))} prompt tokens, {args.max_tokens} output tokens each",
          flush=True)
    results = {}
    for caching in (True, False):
        r = run(path, prompts, args.max_tokens, caching, args)
        print(f"  caching {'on ' if caching else 'off'}: {r['wall_s']:.1f}s", flush=True)
        results["on" if caching else "off"] = r
    on, off = results["on"], results["off"]
    same = on["token_ids"] == off["token_ids"]
    table("Shared 512-token system prompt (issue 4 workload)", on, off)
    cut = 1 - on["prefill_tokens_computed"] / off["prefill_tokens_computed"]
    print(f"\nprefill tokens computed cut by {cut:.1%}; TTFT p50 {off['ttft_p50_s'] / on['ttft_p50_s']:.2f}x lower; "
          f"greedy outputs identical on/off: {same}")
    summary = {"shared": {k: {kk: vv for kk, vv in v.items() if kk not in ("token_ids", "ttft")}
                          for k, v in results.items()},
               "prefill_cut": cut, "ttft_p50_ratio": off["ttft_p50_s"] / on["ttft_p50_s"], "identical": same}
    if not args.skip_no_share:
        plain = distinct_workload(args.no_share_requests, args.seed, vocab, 32 + args.system_len // 4,
                                  128 + args.system_len // 2)
        print(f"\nno-sharing workload: {len(plain)} requests, {sum(map(len, plain))} prompt tokens; "
              "runs on, off, off, on (interleaved against load drift)", flush=True)
        runs = {True: [], False: []}
        for caching in (True, False, False, True):
            r = run(path, plain, args.max_tokens, caching, args)
            print(f"  caching {'on ' if caching else 'off'}: {r['wall_s']:.1f}s", flush=True)
            runs[caching].append(r)
        best = {c: min(rs, key=lambda r: r["cpu_s"]) for c, rs in runs.items()}
        table("No shared prefix (of 2 runs each, the one with less CPU time)", best[True], best[False])
        overhead = best[True]["wall_s"] / best[False]["wall_s"] - 1
        cpu_overhead = best[True]["cpu_s"] / best[False]["cpu_s"] - 1
        print(f"\ncaching overhead when nothing hits: {overhead:+.1%} total time, {cpu_overhead:+.1%} CPU time "
              f"(hit rate {best[True]['hit_rate']:.1%})")
        summary["no_share_cpu_overhead"] = cpu_overhead
        summary["no_share"] = {("on" if c else "off"): {kk: vv for kk, vv in r.items() if kk not in ("token_ids", "ttft")}
                               for c, r in best.items()}
        summary["no_share_overhead"] = overhead
    print(machine_note())
    summary["machine"] = machine_note()
    summary["args"] = vars(args)
    write_json(args.json, summary)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for name, r in (("caching on", on), ("caching off", off)):
            xs = sorted(r["ttft"])
            ax.plot(xs, [i / len(xs) for i in range(1, len(xs) + 1)], label=name)
        ax.set_xlabel("time to first token (s)")
        ax.set_ylabel("fraction of requests")
        ax.set_title("TTFT CDF, shared 512-token prefix")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()

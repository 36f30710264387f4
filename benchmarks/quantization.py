"""Weight-only quantization on the default model: size, quality and CPU speed, per variant.

    .venv/bin/python benchmarks/quantization.py [--plot ppl.png] [--json out.json] [--crossover]
                                                [--variants fp32,w8,w4-g128,w4-g128-gptq] [--quality-only]

Variants: fp32 and bf16 (the source weights), w8 (int8 per channel, round-to-nearest),
w4 with groups of 128 and 32, each by round-to-nearest and by GPTQ. Quantized folders are
made once with `inflight quantize` settings and kept in $INFLIGHT_CACHE_DIR/quantized/.
Quantized variants run with bf16 activations (W8A16 / W4A16).

For each variant:
- weight bytes of the quantized layers (the decoder projections) and of the whole folder,
  beside what bf16 takes for the same tensors;
- perplexity on held-out texts, in windows of --ppl-len tokens, computed by the engine
  itself (`Engine.score`, prompt logprobs), each beside fp32's: in domain, stdlib
  docstrings disjoint from the calibration's docstrings; out of domain, English prose the
  calibration never saw (benchmarks/heldout/prose.txt) and stdlib code stripped of its
  docstrings and comments (engine/quant/calibration.py); then, per w4 group size and
  text, the share of round-to-nearest's gap to fp32 that GPTQ closes,
  (RTN - GPTQ) / (RTN - fp32). GPTQ uses the default calibration (`inflight quantize`
  without --calib: the model's own chat answers plus docstrings);
- greedy agreement with fp32: share of the first --tokens output tokens identical, position
  by position, over --prompts prompts (pieces of the held-out text after the perplexity part);
- CPU decode tok/s at batch 1 and at batch --prompts (the same greedy run): decode steps
  only, after every request has its first token; CPU seconds beside wall seconds.

KV-cache dtypes (`--kv-cache-dtypes auto,int8,fp8`, on the source weights in each of
`--kv-model-dtypes float32,bfloat16`; `--kv-only` runs this part alone): perplexity beside
the model dtype's cache (`auto`), KV blocks that the same --kv-cache-mib budget holds, and
greedy agreement with `auto` (same prompts and tokens as above), and that run's decode
tok/s (wall and per CPU second).

`--crossover` adds the table behind the CPU dispatch in kernels/quant_cpu.py: one layer's
four matmuls (SmolLM2-135M shapes) by rows, dense vs torch's packed int kernels vs
dequantize-on-the-fly.
"""

from __future__ import annotations

import math
import pathlib
import time

from common import Timer, base_parser, machine_note, model_path, print_table, setup_torch, write_json

VARIANTS = {  # name: (scheme, group size, method) or None for the source weights
    "fp32": None, "bf16": None,
    "w8": ("w8", None, "rtn"),
    "w4-g128": ("w4", 128, "rtn"), "w4-g128-gptq": ("w4", 128, "gptq"),
    "w4-g32": ("w4", 32, "rtn"), "w4-g32-gptq": ("w4", 32, "gptq"),
}


def quantized_folder(src: pathlib.Path, name: str) -> pathlib.Path:
    from inflight.engine.quant.calibration import CALIBRATION_VERSION
    from inflight.engine.quant.config import QuantConfig
    from inflight.engine.quant.quantize import quantize_model
    from inflight.schemas.settings import Settings

    scheme, group, method = VARIANTS[name]
    # a GPTQ folder's name carries the default calibration's version: one made with an
    # older recipe (e.g. docstrings only, before version 2) is not reused
    tag = f"-cal{CALIBRATION_VERSION}" if method == "gptq" else ""
    dest = pathlib.Path(Settings().cache_dir).expanduser() / "quantized" / f"{src.name}-{name}{tag}"
    if not (dest / "config.json").is_file():
        print(f"quantizing {src.name} -> {dest}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        quantize_model(src, dest, QuantConfig(scheme, group, method), progress=print)
    return dest


def weight_bytes(folder: pathlib.Path) -> dict:
    """Bytes of the stored tensors: quantized layers (or the same projections unquantized),
    the whole folder, and the bf16 bytes of the same tensors."""
    from safetensors import safe_open

    from inflight.engine.quant.config import LINEAR_NAMES

    layer_bytes = total = bf16_layers = bf16_total = 0
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for name in st.keys():
                t = st.get_slice(name)
                numel = math.prod(t.get_shape())
                nbytes = numel * {"F32": 4, "BF16": 2, "F16": 2, "I8": 1, "U8": 1}[t.get_dtype()]
                base = name.rsplit(".", 1)[0]
                is_layer = any(base.endswith(n) for n in LINEAR_NAMES)
                total += nbytes
                if is_layer:
                    layer_bytes += nbytes
                # the bf16 twin: a projection's N x K weights (qweight packs K for w4)
                if name.endswith(".weight") or not is_layer:
                    bf16 = 2 * numel
                elif name.endswith(".qweight"):
                    bf16 = 2 * numel * (2 if t.get_dtype() == "U8" else 1)
                else:
                    bf16 = 0  # scales / zeros have no bf16 twin
                bf16_total += bf16
                if is_layer:
                    bf16_layers += bf16
    return {"layer_bytes": layer_bytes, "total_bytes": total, "bf16_layer_bytes": bf16_layers,
            "bf16_total_bytes": bf16_total}


HELDOUT = pathlib.Path(__file__).resolve().parent / "heldout"


def eval_tokens(tokenizer, ppl_windows: int, ppl_len: int, prompts: int, prompt_len: int):
    """Perplexity windows per evaluation text, greedy prompts, and the texts' provenance.

    - docstrings (in domain): held-out stdlib docstrings, the first `ppl_windows` windows;
    - prose (out of domain): benchmarks/heldout/prose.txt, every whole window (at most
      `ppl_windows`);
    - code (out of domain): stdlib code without docstrings or comments, `ppl_windows`
      windows evenly spread over it (one file would fill the first ones)."""
    from inflight.engine.quant.calibration import code_text, evaluation_text, heldout_text, text_digest

    texts = {"docstrings": evaluation_text(), "prose": heldout_text(HELDOUT / "prose.txt"), "code": code_text()}
    sets, info = {}, {}
    for name, text in texts.items():
        ids = tokenizer.encode(text)
        have = len(ids) // ppl_len
        info[name] = {"sha256_16": text_digest(text), "tokens": len(ids)}
        if name == "docstrings":
            need = ppl_windows * ppl_len + prompts * prompt_len
            if len(ids) < need:
                raise SystemExit(f"the held-out docstrings have {len(ids)} tokens, {need} needed: lower --ppl-windows")
            picks = list(range(ppl_windows))
            start = ppl_windows * ppl_len
            greedy = [ids[start + i * prompt_len:start + (i + 1) * prompt_len] for i in range(prompts)]
        elif name == "prose":
            picks = list(range(min(have, ppl_windows)))
        else:
            picks = [(j * have) // ppl_windows for j in range(min(have, ppl_windows))]
        sets[name] = [ids[i * ppl_len:(i + 1) * ppl_len] for i in picks]
        info[name]["windows"] = len(picks)
    return sets, greedy, info


def perplexity(eng, windows) -> tuple[float, float, float]:
    with Timer() as t:
        scores = eng.score(windows)
    lps = [lp for s in scores for lp in s.logprobs[1:]]
    return math.exp(-sum(lps) / len(lps)), t.elapsed, t.cpu


def decode_run(eng, prompts, tokens: int) -> dict:
    """Greedy, ignore_eos: tokens of each prompt, and decode-only tok/s after the first step
    (which prefills every prompt; the step budget is set to hold them all)."""
    from inflight.engine import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        eng.add_request(f"d{i}", prompt_token_ids=p, params=params)
    got: dict[str, list[int]] = {f"d{i}": [] for i in range(len(prompts))}
    first = True
    with Timer() as t:
        while eng.has_unfinished():
            outs = eng.step()
            for out in outs:
                got[out.request_id] += out.new_token_ids
            if first:
                assert all(len(v) == 1 for v in got.values()), "the first step must prefill every prompt"
                first = False
                t0, c0 = time.perf_counter(), time.process_time()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    decoded = len(prompts) * (tokens - 1)
    return {"tokens": [got[f"d{i}"] for i in range(len(prompts))], "decode_tok_s": decoded / wall,
            "decode_tok_per_cpu_s": decoded / cpu, "decode_wall_s": wall, "total_wall_s": t.elapsed}


def run_variant(name, folder, dtype, args, sets, prompts) -> dict:
    from inflight.engine import Engine, EngineConfig, SamplingParams

    eng = Engine(EngineConfig(model=folder, dtype=dtype, max_num_seqs=max(64, args.prompts),
                              max_num_batched_tokens=max(4096, args.prompts * args.prompt_len,
                                                         args.ppl_len * 4),
                              kv_cache_bytes=args.kv_cache_mib << 20, seed=args.seed))
    eng.generate([prompts[0][:16]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    row = {"variant": name, "dtype": dtype, "folder": str(folder)}
    for text, windows in sets.items():
        row[f"ppl_{text}"], row[f"ppl_{text}_wall_s"], row[f"ppl_{text}_cpu_s"] = perplexity(eng, windows)
    row["ppl"] = row["ppl_docstrings"]
    print(f"{name}: ppl " + ", ".join(f"{t} {row[f'ppl_{t}']:.4f}" for t in sets), flush=True)
    if args.quality_only:
        return row
    one = decode_run(eng, prompts[:1], args.tokens)
    many = decode_run(eng, prompts, args.tokens)
    row.update(tokens=many["tokens"], tok_s_b1=one["decode_tok_s"], tok_cpu_b1=one["decode_tok_per_cpu_s"],
               tok_s_bn=many["decode_tok_s"], tok_cpu_bn=many["decode_tok_per_cpu_s"])
    print(f"{name}: decode b1 {row['tok_s_b1']:.1f} "
          f"b{args.prompts} {row['tok_s_bn']:.1f} tok/s", flush=True)
    return row


def kv_cache_report(src: pathlib.Path, args, windows, prompts) -> list[dict]:
    """8-bit KV caches (kernels/kv_quant.py) against the model dtype's, per model dtype."""
    from inflight.engine import Engine, EngineConfig, SamplingParams

    kv_names = [n for n in args.kv_cache_dtypes.split(",") if n]
    if not kv_names:
        return []
    if "auto" not in kv_names:
        kv_names.insert(0, "auto")  # the reference of every column
    results = []
    for dtype in [d for d in args.kv_model_dtypes.split(",") if d]:
        by: dict[str, dict] = {}
        for kv in kv_names:
            eng = Engine(EngineConfig(model=src, dtype=dtype, kv_cache_dtype=kv,
                                      max_num_seqs=max(64, args.prompts),
                                      max_num_batched_tokens=max(4096, args.prompts * args.prompt_len,
                                                                 args.ppl_len * 4),
                                      kv_cache_bytes=args.kv_cache_mib << 20, seed=args.seed))
            eng.generate([prompts[0][:16]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
            row = {"model_dtype": dtype, "kv_cache_dtype": kv, "num_kv_blocks": eng.num_kv_blocks,
                   "kv_bytes_per_token": eng.model.kv_bytes_per_block(eng.block_size) // eng.block_size}
            row["ppl"], row["ppl_wall_s"], row["ppl_cpu_s"] = perplexity(eng, windows)
            run = decode_run(eng, prompts, args.tokens)
            row.update(tokens=run["tokens"], tok_s=run["decode_tok_s"], tok_cpu=run["decode_tok_per_cpu_s"])
            eng.close()
            by[kv] = row
            print(f"{dtype} kv {kv}: {row['num_kv_blocks']} blocks, ppl {row['ppl']:.4f} "
                  f"({row['ppl_wall_s']:.0f}s)", flush=True)
        ref = dict(by["auto"])
        for row in by.values():
            row["blocks_vs_auto"] = row["num_kv_blocks"] / ref["num_kv_blocks"]
            row["ppl_vs_auto"] = row["ppl"] / ref["ppl"] - 1
            agree = sum(a == b for got, want in zip(row["tokens"], ref["tokens"]) for a, b in zip(got, want))
            row["greedy_agreement"] = agree / sum(len(t) for t in ref["tokens"])
            first = sum(got[0] == want[0] for got, want in zip(row["tokens"], ref["tokens"]))
            row["first_token_agreement"] = first / len(ref["tokens"])
            del row["tokens"]
            results.append(row)
    print_table(f"{src.name}: KV-cache dtypes on the source weights; {args.kv_cache_mib} MiB of KV; "
                f"{len(windows)} x {args.ppl_len} held-out tokens; greedy agreement with auto over "
                f"{args.prompts} prompts x {args.tokens} tokens",
                [(r["model_dtype"], r["kv_cache_dtype"], r["kv_bytes_per_token"], r["num_kv_blocks"],
                  f"{r['blocks_vs_auto']:.2f}x", f"{r['ppl']:.4f}", f"{100 * r['ppl_vs_auto']:+.2f}%",
                  f"{100 * r['greedy_agreement']:.1f}%", f"{100 * r['first_token_agreement']:.1f}%",
                  r["tok_s"], r["tok_cpu"])
                 for r in results],
                ("model dtype", "KV cache", "bytes/token", "KV blocks", "vs auto", "ppl", "vs auto",
                 "greedy = auto", "first token = auto", f"tok/s b{args.prompts}",
                 f"tok/CPU s b{args.prompts}"))
    return results


def crossover(threads: int) -> list[tuple]:
    """Per rows M: one SmolLM2-135M layer's four matmuls (q|k|v, o, gate|up, down), ms."""
    import torch
    import torch.nn.functional as F

    from inflight.kernels.quant import dequantize_w4_grouped, dequantize_w8
    from inflight.kernels.quant_cpu import Int4PackedCPU, w8a16_matmul_cpu
    from inflight.engine.quant.rtn import quantize_w4, quantize_w8

    shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(n, k, generator=g) * 0.05 for n, k in shapes]
    bf = [w.bfloat16() for w in ws]
    q8 = [quantize_w8(w) for w in ws]
    q4 = [quantize_w4(w, 128) for w in ws]
    p4 = [Int4PackedCPU.from_w4(q.qweight, q.scales, q.zeros, 128, torch.bfloat16) for q in q4]
    s8 = [q.scales.bfloat16() for q in q8]

    def timed(fn, reps=5) -> float:
        fn()
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            best = min(best, (time.perf_counter() - t0) / reps)
        return best * 1e3

    rows = []
    with torch.inference_mode():
        for m in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            xs = [torch.randn(m, k, generator=g).bfloat16() for _, k in shapes]
            xf = [x.float() for x in xs]
            rows.append((m,
                         timed(lambda: [F.linear(x, w) for x, w in zip(xf, ws)]),
                         timed(lambda: [F.linear(x, w) for x, w in zip(xs, bf)]),
                         timed(lambda: [w8a16_matmul_cpu(x, q.qweight, s) for x, q, s in zip(xs, q8, s8)]),
                         timed(lambda: [F.linear(x, dequantize_w8(q.qweight, q.scales, x.dtype)) for x, q in zip(xs, q8)]),
                         timed(lambda: [p.matmul(x) for x, p in zip(xs, p4)]),
                         timed(lambda: [F.linear(x, dequantize_w4_grouped(q.qweight, q.scales, q.zeros, 128, x.dtype))
                                        for x, q in zip(xs, q4)])))
    return rows


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    p.add_argument("--quant-dtype", default="bfloat16", help="activation dtype of quantized variants")
    p.add_argument("--ppl-windows", type=int, default=32)
    p.add_argument("--ppl-len", type=int, default=512)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=48)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--kv-cache-mib", type=int, default=1024)
    p.add_argument("--quality-only", action="store_true",
                   help="perplexities and sizes only: no greedy agreement, no decode speed")
    p.add_argument("--crossover", action="store_true", help="also time the CPU matmul paths by rows")
    p.add_argument("--kv-cache-dtypes", default="auto,int8,fp8",
                   help="KV-cache dtypes compared on the source weights ('' = none)")
    p.add_argument("--kv-model-dtypes", default="float32,bfloat16", help="model dtypes of that comparison")
    p.add_argument("--kv-only", action="store_true", help="only the KV-cache comparison")
    args = p.parse_args()
    setup_torch(args.threads, args.seed)
    from inflight.engine.tokenizer import Tokenizer

    src = model_path(args.model)
    names = [n for n in args.variants.split(",") if n]
    unknown = set(names) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; choose from {list(VARIANTS)}")
    if "fp32" not in names:
        names.insert(0, "fp32")  # the reference of greedy agreement
    folders = {n: src if VARIANTS[n] is None else quantized_folder(src, n) for n in names}
    sets, prompts, text_info = eval_tokens(Tokenizer(src), args.ppl_windows, args.ppl_len,
                                              args.prompts, args.prompt_len)
    if args.kv_only:
        kv = kv_cache_report(src, args, sets["docstrings"], prompts)
        print(f"\n{machine_note()}; eval text {text_info}")
        write_json(args.json, {"kv_cache": kv, "text": text_info, "args": vars(args)})
        return
    results = []
    for n in names:
        dtype = n if VARIANTS[n] is None else args.quant_dtype
        dtype = {"fp32": "float32", "bf16": "bfloat16"}.get(dtype, dtype)
        row = run_variant(n, folders[n], dtype, args, sets, prompts)
        row.update(weight_bytes(folders[n]))
        results.append(row)

    by = {r["variant"]: r for r in results}
    ref = by["fp32"]
    texts = list(sets)
    src_bytes = weight_bytes(src)
    rows = []
    for r in results:
        if not args.quality_only:
            agree = sum(a == b for got, want in zip(r["tokens"], ref["tokens"]) for a, b in zip(got, want))
            r["greedy_agreement"] = agree / (len(ref["tokens"]) * args.tokens)
        if VARIANTS[r["variant"]] is None:  # source weights held in fp32 or bf16
            scale = 2 if r["variant"] == "fp32" else 1
            r["layer_bytes"] = src_bytes["bf16_layer_bytes"] * scale
            r["total_bytes"] = src_bytes["bf16_total_bytes"] * scale
        r["layer_ratio"] = r["layer_bytes"] / src_bytes["bf16_layer_bytes"]
        r["total_ratio"] = r["total_bytes"] / src_bytes["bf16_total_bytes"]
        cells = []
        for t in texts:
            r[f"ppl_{t}_vs_fp32"] = r[f"ppl_{t}"] / ref[f"ppl_{t}"] - 1
            cells += [r[f"ppl_{t}"], f"{100 * r[f'ppl_{t}_vs_fp32']:+.2f}%"]
        speed = ("-",) * 5 if args.quality_only else (
            f"{100 * r['greedy_agreement']:.1f}%", r["tok_s_b1"], r["tok_cpu_b1"], r["tok_s_bn"], r["tok_cpu_bn"])
        rows.append((r["variant"], r["dtype"], f"{r['layer_bytes'] / 1e6:.1f}", f"{r['layer_ratio']:.3f}x",
                     f"{r['total_bytes'] / 1e6:.1f}", f"{r['total_ratio']:.3f}x", *cells, *speed))
    counts = ", ".join(f"{t} {text_info[t]['windows']}" for t in texts)
    print_table(f"{src.name}: perplexity on windows of {args.ppl_len} held-out tokens ({counts}); "
                f"docstrings in domain, prose and code out of domain; greedy agreement over "
                f"{args.prompts} prompts x {args.tokens} tokens; {args.threads} torch thread(s)",
                rows, ("variant", "act", "layers MB", "vs bf16", "folder MB", "vs bf16",
                       *[c for t in texts for c in (f"ppl {t}", "vs fp32")],
                       "greedy = fp32", "tok/s b1", "tok/CPU s b1", f"tok/s b{args.prompts}",
                       f"tok/CPU s b{args.prompts}"))
    gaps = []
    for g in (128, 32):
        rtn, gptq = by.get(f"w4-g{g}"), by.get(f"w4-g{g}-gptq")
        if rtn and gptq:
            for t in texts:
                gap = rtn[f"ppl_{t}"] - ref[f"ppl_{t}"]
                closed = (rtn[f"ppl_{t}"] - gptq[f"ppl_{t}"]) / gap if gap > 0 else float("nan")
                gaps.append((f"g{g}", t, "in" if t == "docstrings" else "out", ref[f"ppl_{t}"],
                             rtn[f"ppl_{t}"], gptq[f"ppl_{t}"], f"{100 * closed:.0f}%"))
    if gaps:
        print_table("GPTQ (default calibration): share of round-to-nearest's perplexity gap to fp32 "
                    "that it closes, (RTN - GPTQ) / (RTN - fp32)", gaps,
                    ("w4 groups", "text", "domain", "fp32 ppl", "RTN ppl", "GPTQ ppl", "gap closed"))
    cross = []
    if args.crossover:
        cross = crossover(args.threads)
        print_table("CPU matmuls of one SmolLM2-135M layer (4 projections), ms, bf16 activations unless fp32",
                    cross, ("rows", "dense fp32", "dense bf16", "int8 packed", "w8 dequant+dense",
                            "int4 packed g128", "w4 dequant+dense"))
    kv = kv_cache_report(src, args, sets["docstrings"], prompts)
    print(f"\n{machine_note()}; eval text {text_info}")
    for r in results:
        r.pop("tokens", None)
    write_json(args.json, {"results": results, "gptq_gap": gaps, "crossover": cross, "text": text_info,
                           "kv_cache": kv, "args": vars(args)})
    if args.plot:
        plot(results, args.plot)


def plot(results, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        ax.scatter(r["total_bytes"] / 1e6, r["ppl"], s=40)
        ax.scatter(r["total_bytes"] / 1e6, r["ppl_prose"], s=40, marker="x")
        ax.annotate(r["variant"], (r["total_bytes"] / 1e6, r["ppl"]), textcoords="offset points", xytext=(5, 4))
    ax.set_xlabel("weight bytes, whole folder (MB)")
    ax.set_ylabel("perplexity (o: held-out docstrings, x: prose)")
    ax.set_title("SmolLM2-135M: perplexity vs weight bytes")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""Kernel benchmark: each Triton kernel against the device's peak and a torch baseline.

    python benchmarks/bench_kernels.py [--quick] [--dtype bf16|fp16] [--json out.json] [--plot out.png]

Memory-bound kernels (decode attention, KV write, RMSNorm, rotary, SwiGLU) report achieved
GB/s of compulsory traffic (each input read once, each output written once); prefill
attention reports TFLOP/s of causal attention (4 * Hq * D per visible query/key pair). The
percentages are of the peak given on the command line (default H200: 4.8 TB/s HBM, 790
dense bf16 TFLOP/s reachable in practice, 989 on paper).

Baselines, timed in the same run: for attention, torch gathers the paged K/V into
contiguous tensors and calls scaled_dot_product_attention (what a torch-only engine would
do); for the other kernels, the plain-torch reference op the engine uses on CPU.

`--kv-cache-dtypes int8,fp8` adds decode attention and the KV write on 8-bit caches
(kernels/kv_quant.py: values + one fp16 scale per token and KV head) against the same
kernels on the 16-bit cache, CUDA-graph replay, same shapes, same run (`--kv-only`: that
part alone).

Needs a CUDA GPU; elsewhere it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

# Llama-3-8B layout.
Q_HEADS, KV_HEADS, HEAD_DIM, HIDDEN, INTER = 32, 8, 128, 4096, 14336
BLOCK_SIZE = 16
DECODE_BATCHES = [1, 8, 32, 64, 128, 256]
DECODE_CONTEXTS = [512, 2048, 8192, 32768]
PREFILL_CHUNKS = [512, 1024, 2048, 4096, 8192]
TOKEN_COUNTS = [1, 64, 256, 4096, 16384]
MAX_KV_TOKENS = 256 * 32768             # B * context cap: 2 x 16 GiB of bf16 K/V
BASELINE_MAX_KV_TOKENS = 2 * 1024 * 1024  # the torch gather doubles the memory


def bench_ms(fn) -> float:
    from triton.testing import do_bench

    fn()  # compile first: do_bench sizes its repetitions from its first call
    torch.cuda.synchronize()
    return do_bench(fn, warmup=25, rep=100)


def bench_graph_ms(fn) -> float:
    """`fn` captured once in a CUDA graph and replayed: the kernels' own time, without the
    Python launch overhead (decode steps run this way in the engine)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return bench_ms(graph.replay)


def paged_cache(batch: int, context: int, dtype, seed: int, device: str = "cuda"):
    """A cache holding `batch` contexts of `context` tokens in scattered blocks."""
    gen = torch.Generator(device=device).manual_seed(seed)
    per_seq = math.ceil(context / BLOCK_SIZE)
    num_blocks = batch * per_seq
    k_cache = torch.randn(num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM, device=device, dtype=dtype, generator=gen)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(num_blocks, device=device, generator=gen).view(batch, per_seq).to(torch.int32)
    return k_cache, v_cache, tables


def sdpa_baseline(q, k_cache, v_cache, tables, context: int, q_len: int, scale: float):
    """torch: gather each sequence's pages, then one batched SDPA call (equal lengths)."""
    batch = tables.shape[0]

    def run():
        k = k_cache[tables.long()].view(batch, -1, KV_HEADS, HEAD_DIM)[:, :context].transpose(1, 2)
        v = v_cache[tables.long()].view(batch, -1, KV_HEADS, HEAD_DIM)[:, :context].transpose(1, 2)
        qb = q.view(batch, q_len, Q_HEADS, HEAD_DIM).transpose(1, 2)
        if q_len == 1 or q_len == context:  # no mask, or plain causal: flash with GQA
            return F.scaled_dot_product_attention(qb, k, v, is_causal=q_len > 1, scale=scale,
                                                  enable_gqa=True)
        # Causal after a cached prefix (query i sees keys <= context - q_len + i) needs an
        # explicit mask, which flash does not take: expand the KV heads for efficient attention.
        mask = (torch.arange(context, device="cuda")[None, :]
                <= torch.arange(context - q_len, context, device="cuda")[:, None])
        group = Q_HEADS // KV_HEADS
        return F.scaled_dot_product_attention(qb, k.repeat_interleave(group, 1),
                                              v.repeat_interleave(group, 1), attn_mask=mask, scale=scale)
    return run


def attention_rows(dtype, quick: bool, peaks) -> list[dict]:
    from inflight.kernels.triton_attention import paged_attention_triton

    rows = []
    elt = torch.finfo(dtype).bits // 8
    scale = HEAD_DIM ** -0.5
    batches = [1, 32, 256] if quick else DECODE_BATCHES
    contexts = [2048, 32768] if quick else DECODE_CONTEXTS
    for batch in batches:
        for context in contexts:
            if batch * context > MAX_KV_TOKENS:
                continue
            k_cache, v_cache, tables = paged_cache(batch, context, dtype, seed=batch + context)
            q = torch.randn(batch, Q_HEADS, HEAD_DIM, device="cuda", dtype=dtype)
            seq_lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
            qsl = torch.arange(batch + 1, device="cuda", dtype=torch.int32)
            fn = lambda: paged_attention_triton(q, k_cache, v_cache, tables, seq_lens, qsl, scale)  # noqa: E731
            ms = bench_ms(fn)
            graph_ms = bench_graph_ms(fn)
            nbytes = 2 * batch * context * KV_HEADS * HEAD_DIM * elt + 2 * q.numel() * elt
            base = base_graph = None
            if batch * context <= BASELINE_MAX_KV_TOKENS:
                base_fn = sdpa_baseline(q, k_cache, v_cache, tables, context, 1, scale)
                base, base_graph = bench_ms(base_fn), bench_graph_ms(base_fn)
            rows.append(row("attention decode", f"B={batch} ctx={context}", ms, base,
                            gbs=nbytes / ms / 1e6, peaks=peaks, batch=batch, context=context,
                            graph_ms=graph_ms, graph_pct_peak=100 * nbytes / graph_ms / 1e6 / peaks["gbs"],
                            torch_graph_ms=base_graph))
            del k_cache, v_cache
            torch.cuda.empty_cache()
    for chunk in ([2048, 8192] if quick else PREFILL_CHUNKS):
        for cached in (0, chunk):
            context = cached + chunk
            k_cache, v_cache, tables = paged_cache(1, context, dtype, seed=chunk + cached)
            q = torch.randn(chunk, Q_HEADS, HEAD_DIM, device="cuda", dtype=dtype)
            seq_lens = torch.tensor([context], device="cuda", dtype=torch.int32)
            qsl = torch.tensor([0, chunk], device="cuda", dtype=torch.int32)
            ms = bench_ms(lambda: paged_attention_triton(q, k_cache, v_cache, tables, seq_lens, qsl, scale))
            pairs = chunk * cached + chunk * (chunk + 1) / 2
            flops = 4 * Q_HEADS * HEAD_DIM * pairs
            base = bench_ms(sdpa_baseline(q, k_cache, v_cache, tables, context, chunk, scale))
            rows.append(row("attention prefill", f"chunk={chunk} cached={cached}", ms, base,
                            tflops=flops / ms / 1e9, peaks=peaks, chunk=chunk, cached=cached))
            del k_cache, v_cache
            torch.cuda.empty_cache()
    # One mixed step: 64 decodes at 4k context and one 2048-token prefill chunk, one launch.
    batch, context, chunk = 64, 4096, 2048
    k_cache, v_cache, tables = paged_cache(batch + 1, context, dtype, seed=7)
    q = torch.randn(batch + chunk, Q_HEADS, HEAD_DIM, device="cuda", dtype=dtype)
    seq_lens = torch.tensor([context] * batch + [chunk], device="cuda", dtype=torch.int32)
    qsl = torch.tensor(list(range(batch + 1)) + [batch + chunk], device="cuda", dtype=torch.int32)
    ms = bench_ms(lambda: paged_attention_triton(q, k_cache, v_cache, tables, seq_lens, qsl, scale))
    nbytes = 2 * (batch * context + chunk) * KV_HEADS * HEAD_DIM * elt
    rows.append(row("attention mixed", f"{batch} dec@{context} + chunk {chunk}", ms, None,
                    gbs=nbytes / ms / 1e6, peaks=peaks))
    return rows


def quantized_cache(cache: torch.Tensor, kv_dtype, chunk: int = 4096):
    """cache [num_blocks, ...] -> (8-bit values, fp16 scales), a chunk of blocks at a time
    (the fp32 temporaries of a whole 16 GiB cache would not fit beside it)."""
    from inflight.kernels.kv_quant import SCALE_DTYPE, quantize_kv

    values = torch.empty(cache.shape, dtype=kv_dtype, device=cache.device)
    scales = torch.empty(cache.shape[:3], dtype=SCALE_DTYPE, device=cache.device)
    for i in range(0, cache.shape[0], chunk):
        values[i:i + chunk], scales[i:i + chunk] = quantize_kv(cache[i:i + chunk], kv_dtype)
    return values, scales


def kv8_rows(dtype, quick: bool, peaks, names: list[str], timer=None, device="cuda") -> list[dict]:
    """Decode attention and the KV write on 8-bit caches vs the `dtype` cache, graph replay."""
    from inflight.kernels.kv_quant import KV_CACHE_DTYPES, SCALE_DTYPE, cache_bytes_per_token_head
    from inflight.kernels.triton_attention import paged_attention_triton
    from inflight.kernels.triton_kv_write import write_kv_triton

    timer = timer or bench_graph_ms
    scale = HEAD_DIM ** -0.5
    rows = []
    for batch in ([1, 32, 256] if quick else DECODE_BATCHES):
        for context in ([2048, 32768] if quick else DECODE_CONTEXTS):
            if batch * context > MAX_KV_TOKENS // 2:  # the 8-bit copies live beside the 16-bit cache
                continue
            k_cache, v_cache, tables = paged_cache(batch, context, dtype, seed=batch + context, device=device)
            q = torch.randn(batch, Q_HEADS, HEAD_DIM, device=device, dtype=dtype)
            seq_lens = torch.full((batch,), context, device=device, dtype=torch.int32)
            qsl = torch.arange(batch + 1, device=device, dtype=torch.int32)
            base_ms = timer(lambda: paged_attention_triton(q, k_cache, v_cache, tables, seq_lens, qsl, scale))
            for name in names:
                (k8, ks), (v8, vs) = (quantized_cache(c, KV_CACHE_DTYPES[name]) for c in (k_cache, v_cache))
                ms = timer(lambda: paged_attention_triton(q, k8, v8, tables, seq_lens, qsl, scale,
                                                          k_scale=ks, v_scale=vs))
                nbytes = 2 * batch * context * KV_HEADS * cache_bytes_per_token_head(k8.dtype, HEAD_DIM)
                rows.append(row("attention decode kv8", f"{name} B={batch} ctx={context}", ms, base_ms,
                                gbs=nbytes / ms / 1e6, peaks=peaks, batch=batch, context=context,
                                kv_cache_dtype=name))
                del k8, ks, v8, vs
            del k_cache, v_cache
            if device == "cuda":
                torch.cuda.empty_cache()
    tokens = 4096 if device == "cuda" else 8
    k = torch.randn(tokens, KV_HEADS, HEAD_DIM, device=device, dtype=dtype)
    v = torch.randn_like(k)
    blocks = -(-tokens // BLOCK_SIZE)
    slots = torch.randperm(blocks * BLOCK_SIZE, device=device)[:tokens]
    caches = [torch.empty(blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM, device=device, dtype=dtype) for _ in range(2)]
    base_ms = timer(lambda: write_kv_triton(k, v, caches[0], caches[1], slots))
    for name in names:
        c8 = [torch.empty(c.shape, device=device, dtype=KV_CACHE_DTYPES[name]) for c in caches]
        s8 = [torch.empty(c.shape[:3], device=device, dtype=SCALE_DTYPE) for c in caches]
        ms = timer(lambda: write_kv_triton(k, v, c8[0], c8[1], slots, s8[0], s8[1]))
        nbytes = 2 * k.numel() * k.element_size() + 2 * tokens * KV_HEADS * cache_bytes_per_token_head(
            c8[0].dtype, HEAD_DIM)
        rows.append(row("kv write kv8", f"{name} T={tokens}", ms, base_ms, gbs=nbytes / ms / 1e6,
                        peaks=peaks, kv_cache_dtype=name))
    return rows


def elementwise_rows(dtype, quick: bool, peaks) -> list[dict]:
    from inflight.kernels.activation import silu_and_mul_ref
    from inflight.kernels.kv_write import write_kv_ref
    from inflight.kernels.rmsnorm import rms_norm_ref
    from inflight.kernels.rotary import rope_cos_sin, rotary_ref
    from inflight.kernels.triton_activation import silu_and_mul_triton
    from inflight.kernels.triton_kv_write import write_kv_triton
    from inflight.kernels.triton_rmsnorm import rms_norm_triton
    from inflight.kernels.triton_rotary import rotary_triton

    rows = []
    elt = torch.finfo(dtype).bits // 8
    dev = dict(device="cuda", dtype=dtype)
    cos_sin = rope_cos_sin(HEAD_DIM, 32768, 500000.0, device="cuda")
    for T in ([1, 4096] if quick else TOKEN_COUNTS):
        shape = f"T={T}"
        # KV write: read k, v; write them into scattered slots.
        k = torch.randn(T, KV_HEADS, HEAD_DIM, **dev)
        v = torch.randn_like(k)
        num_blocks = max(1, T // BLOCK_SIZE) * 4
        k_cache = torch.empty(num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM, **dev)
        v_cache = torch.empty_like(k_cache)
        slots = torch.randperm(num_blocks * BLOCK_SIZE, device="cuda")[:T]
        rows.append(timed("write_kv", shape, 4 * k.numel() * elt, peaks,
                          lambda: write_kv_triton(k, v, k_cache, v_cache, slots),
                          lambda: write_kv_ref(k, v, k_cache, v_cache, slots)))
        # RMSNorm with residual: read x, residual, weight; write out, new residual.
        x = torch.randn(T, HIDDEN, **dev)
        res = torch.randn_like(x)
        w = torch.randn(HIDDEN, **dev)
        rows.append(timed("rms_norm+residual", shape, 4 * x.numel() * elt, peaks,
                          lambda: rms_norm_triton(x, w, 1e-5, res),
                          lambda: rms_norm_ref(x, w, 1e-5, res)))
        # Rotary in place on q and k: read and write both.
        q = torch.randn(T, Q_HEADS, HEAD_DIM, **dev)
        kr = torch.randn(T, KV_HEADS, HEAD_DIM, **dev)
        pos = torch.randint(0, 32768, (T,), device="cuda")
        rows.append(timed("rotary", shape, 2 * (q.numel() + kr.numel()) * elt, peaks,
                          lambda: rotary_triton(q, kr, pos, cos_sin),
                          lambda: rotary_ref(q, kr, pos, cos_sin)))
        # SwiGLU: read gate|up, write the product.
        gu = torch.randn(T, 2 * INTER, **dev)
        rows.append(timed("silu_and_mul", shape, 3 * T * INTER * elt, peaks,
                          lambda: silu_and_mul_triton(gu), lambda: silu_and_mul_ref(gu)))
    return rows


def timed(kernel, shape, nbytes, peaks, triton_fn, torch_fn) -> dict:
    ms = bench_ms(triton_fn)
    return row(kernel, shape, ms, bench_ms(torch_fn), gbs=nbytes / ms / 1e6, peaks=peaks)


def row(kernel, shape, ms, base_ms, *, peaks, gbs=None, tflops=None, **extra) -> dict:
    if gbs is not None:
        rate, unit, pct = gbs, "GB/s", 100 * gbs / peaks["gbs"]
    else:
        rate, unit, pct = tflops, "TFLOP/s", 100 * tflops / peaks["tflops"]
    return dict(kernel=kernel, shape=shape, triton_ms=ms, rate=rate, unit=unit, pct_peak=pct,
                torch_ms=base_ms, speedup=(base_ms / ms) if base_ms else None, **extra)


def print_table(rows: list[dict], peaks: dict) -> None:
    print(f"peak: {peaks['gbs']:.0f} GB/s, {peaks['tflops']:.0f} TFLOP/s ({peaks['name']})")
    head = f"{'kernel':<20} {'shape':<28} {'triton ms':>10} {'rate':>16} {'% peak':>7} {'torch ms':>10} {'speedup':>8}"
    print(head)
    print("-" * len(head))
    for r in rows:
        torch_ms = f"{r['torch_ms']:.4f}" if r["torch_ms"] else "-"
        speedup = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        print(f"{r['kernel']:<20} {r['shape']:<28} {r['triton_ms']:>10.4f} "
              f"{r['rate']:>8.1f} {r['unit']:<7} {r['pct_peak']:>6.1f}% {torch_ms:>10} {speedup:>8}")
    graphed = [r for r in rows if r.get("graph_ms")]
    if graphed:
        print("\ndecode attention replayed in a CUDA graph (as the engine's decode steps run)")
        head = f"{'shape':<28} {'triton ms':>10} {'% HBM peak':>10} {'torch ms':>10} {'speedup':>8}"
        print(head)
        print("-" * len(head))
        for r in graphed:
            base = r["torch_graph_ms"]
            base_s = f"{base:.4f}" if base else "-"
            speed_s = f"{base / r['graph_ms']:.2f}x" if base else "-"
            print(f"{r['shape']:<28} {r['graph_ms']:>10.4f} {r['graph_pct_peak']:>9.1f}% "
                  f"{base_s:>10} {speed_s:>8}")


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    decode = [r for r in rows if r["kernel"] == "attention decode"]
    for batch in sorted({r["batch"] for r in decode}):
        pts = sorted((r["context"], r["pct_peak"]) for r in decode if r["batch"] == batch)
        ax1.plot(*zip(*pts), marker="o", label=f"B={batch}")
    ax1.set(xscale="log", xlabel="context", ylabel="% of HBM peak", title="decode attention")
    ax1.legend()
    others = [r for r in rows if not r["kernel"].startswith("attention decode")]
    ax2.barh([f"{r['kernel']} {r['shape']}" for r in others], [r["pct_peak"] for r in others])
    ax2.set(xlabel="% of peak (GB/s or TFLOP/s)", title="other kernels")
    ax2.tick_params(axis="y", labelsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--quick", action="store_true", help="a few shapes only")
    parser.add_argument("--peak-gbs", type=float, default=4800.0, help="HBM peak, GB/s (H200: 4800)")
    parser.add_argument("--peak-tflops", type=float, default=790.0,
                        help="dense 16-bit TFLOP/s reachable (H200: ~790; 989 on paper)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    parser.add_argument("--plot", metavar="PATH", help="also save a plot (PNG)")
    parser.add_argument("--kv-cache-dtypes", default="", help="8-bit KV caches to add, e.g. int8,fp8")
    parser.add_argument("--kv-only", action="store_true", help="only the 8-bit KV-cache rows")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/bench_kernels.py needs a CUDA GPU (none found); nothing measured.")
        return 0
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    peaks = dict(gbs=args.peak_gbs, tflops=args.peak_tflops, name=torch.cuda.get_device_name())
    kv8 = [n for n in args.kv_cache_dtypes.split(",") if n]
    rows = [] if args.kv_only else attention_rows(dtype, args.quick, peaks) + elementwise_rows(dtype, args.quick, peaks)
    if kv8:
        rows += kv8_rows(dtype, args.quick, peaks, kv8)
        print(f"kv8 rows: CUDA-graph replay; 'torch ms' there is the same Triton kernel on the {args.dtype} cache")
    print_table(rows, peaks)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(dict(peaks=peaks, dtype=args.dtype, rows=rows), indent=1))
        print(f"json: {args.json}")
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The CPU matmul paths for fp32 activations, by rows: where each kernel wins.

    python benchmarks/cpu_kernels.py [--threads 1] [--rows 1,2,4,8,16,32,64] [--json out.json]

Every decoder matmul of SmolLM2-135M (30 layers x q|k|v, o, gate|up, down, random weights
of its shapes) plus its LM head, run once per measurement, so that, as in a decode step,
each weight streams from memory (a single layer's weights would sit in the L2 cache and
time the arithmetic instead). Process CPU ms (the steadier figure on a shared machine;
best of --reps), per path:

    dense: MKL     F.linear (MKL; what fp32 took before)
    dense: engine  `dense_linear` as dispatched (engine/quant/linear.py: the project's
                   kernel up to F32_KERNEL_MAX_ROWS rows, then oneDNN / MKL)
    dense: kernel  the project's fp32 kernel (kernels/csrc/cpu_dense_linear.cpp) at every size
    w8: kernel     the exact int8 x fp32 kernel (kernels/quant_cpu.py, W8PackedCPU)
    w8: dequant    dequantize-on-the-fly + F.linear
    w4: kernel     the exact int4 x fp32 kernel, groups of --group (W4PackedCPU)
    w4: dequant    `dequantize_w4_grouped` + F.linear

The crossovers behind F32_KERNEL_MAX_ROWS (engine/quant/linear.py) and W8/W4_KERNEL_MAX_ROWS
(kernels/quant_cpu.py) come from this table (docs/benchmarks.md).
"""

from __future__ import annotations

import time

from common import base_parser, machine_note, print_table, setup_torch, write_json

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
LAYERS, VOCAB = 30, 49152


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,2,4,8,16,32,64")
    p.add_argument("--group", type=int, default=32)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    setup_torch(args.threads, args.seed)
    import torch
    import torch.nn.functional as F

    from inflight.engine.quant.linear import dense_linear
    from inflight.engine.quant.rtn import quantize_w4, quantize_w8
    from inflight.kernels.cpu_native import native
    from inflight.kernels.quant import dequantize_w4_grouped, dequantize_w8
    from inflight.kernels.quant_cpu import W4PackedCPU, W8PackedCPU

    if native() is None:
        raise SystemExit("the CPU kernels do not build here (see the log above)")
    g = torch.Generator().manual_seed(args.seed)
    ws = [torch.randn(n, k, generator=g) * 0.05 for _ in range(LAYERS) for n, k in SHAPES]
    head = torch.randn(VOCAB, 576, generator=g) * 0.05
    q8 = [quantize_w8(w) for w in ws]
    q4 = [quantize_w4(w, args.group) for w in ws]
    k8 = [W8PackedCPU.from_w8(q.qweight, q.scales) for q in q8]
    k4 = [W4PackedCPU.from_w4(q.qweight, q.scales, q.zeros, args.group) for q in q4]

    def timed(fn) -> float:
        fn()
        best = float("inf")
        for _ in range(args.reps):
            c = time.process_time()
            fn()
            best = min(best, time.process_time() - c)
        return best * 1e3

    paths = {
        "dense: MKL": lambda xs: [F.linear(x, w) for x, w in zip(xs, ws)],
        "dense: engine": lambda xs: [dense_linear(x, w) for x, w in zip(xs, ws)],
        "dense: kernel": lambda xs: [native().f32_linear(x, w, None) for x, w in zip(xs, ws)],
        "w8: kernel": lambda xs: [k.matmul(x) for x, k in zip(xs, k8)],
        "w8: dequant": lambda xs: [F.linear(x, dequantize_w8(q.qweight, q.scales, x.dtype)) for x, q in zip(xs, q8)],
        "w4: kernel": lambda xs: [k.matmul(x) for x, k in zip(xs, k4)],
        "w4: dequant": lambda xs: [F.linear(x, dequantize_w4_grouped(q.qweight, q.scales, q.zeros, args.group,
                                                                      x.dtype)) for x, q in zip(xs, q4)],
    }
    rows, results = [], []
    with torch.inference_mode():
        for m in [int(r) for r in args.rows.split(",")]:
            xs = [torch.randn(m, k, generator=g) for _ in range(LAYERS) for _, k in SHAPES]
            xh = torch.randn(m, 576, generator=g)
            r = {name: timed(lambda: fn(xs)) for name, fn in paths.items()}
            r["head: MKL"] = timed(lambda: F.linear(xh, head))
            r["head: engine"] = timed(lambda: dense_linear(xh, head))
            results.append(dict(rows=m, **r))
            rows.append((m, *(r[k] for k in r)))
            print(f"  {m} rows done", flush=True)
    print_table(f"CPU ms (process CPU, best of {args.reps}) for SmolLM2-135M's 120 decoder matmuls "
                f"(streamed from memory) and its LM head, fp32 activations, {args.threads} thread(s), "
                f"w4 groups of {args.group}", rows, ("rows", *[k for k in results[0] if k != "rows"]))
    print(machine_note())
    write_json(args.json, {"results": results, "args": vars(args), "machine": machine_note()})


if __name__ == "__main__":
    main()

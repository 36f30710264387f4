"""W8A16 / W4A16 GEMMs and quantized decode steps on a GPU, against bf16.

    python benchmarks/bench_quant_gemm.py [--model-1b DIR] [--json out.json] [--quick]

1. GEMMs: the four matmuls of one decoder layer of the "1B" shape (hidden 2048, 32/8 heads
   of 64, intermediate 8192: q|k|v 3072x2048, o 2048x2048, gate|up 16384x2048, down
   2048x8192) at batch 1, 16 and 64: bf16 `F.linear` (cuBLAS) vs the Triton W8A16 and
   W4A16 (groups of 128) kernels with the tiles the wrapper picks, plus the best split-K
   of a sweep (to tune `pick_tiles`). Each is timed as a CUDA graph replay (the kernels'
   time, no launch overhead), and checked against its torch reference. Targets at batch 1
   (the targets): W4A16 >= 2.5x, W8A16 >= 1.5x bf16 over the layer.
2. Decode steps (with --model-1b, a bf16 random-weight checkpoint of that shape, e.g. from
   benchmarks/gpu/make_model.py): the folder quantized to w8 and w4-g128 by round-to-nearest
   on the GPU, each served by the engine in bf16 (CUDA graphs as configured) at batch 1, 16
   and 64: milliseconds per decode step.

Needs a CUDA GPU; elsewhere it says so and exits 0 (`--smoke` runs part 1 on tiny shapes
under TRITON_INTERPRET=1 on the CPU, to check the script itself).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES_1B = {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192)}
SHAPES_SMOKE = {"qkv": (96, 64), "o": (64, 64), "gate_up": (128, 64), "down": (64, 128)}
BATCHES = (1, 16, 64)
SPLITS = (1, 2, 4, 8, 16)


def timer(device: str):
    """ms per call of fn: CUDA graph replays on a GPU; plain wall time on the CPU (smoke)."""

    def cpu_ms(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    if device == "cuda":
        from bench_kernels import bench_graph_ms  # captured once, replayed under do_bench

        return bench_graph_ms
    return cpu_ms


def gemms(device: str, shapes: dict, batches, splits, quick: bool) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from inflight.engine.quant.rtn import quantize_w4, quantize_w8
    from inflight.kernels.quant import w4a16_matmul_ref, w8a16_matmul_ref
    from inflight.kernels.triton_quant_matmul import w4a16_matmul_triton, w8a16_matmul_triton

    ms = timer(device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    for name, (n, k) in shapes.items():
        w = torch.randn(n, k, device=device, generator=gen, dtype=torch.float32) * 0.02
        wb = w.to(dtype)
        q8 = quantize_w8(w)
        q4 = quantize_w4(w, 128 if k % 128 == 0 or device == "cuda" else 32)
        group = 128 if k % 128 == 0 or device == "cuda" else 32
        for m in batches:
            x = torch.randn(m, k, device=device, generator=gen, dtype=torch.float32).to(dtype)
            kernels = {
                "w8": (lambda split=None: w8a16_matmul_triton(x, q8.qweight, q8.scales, split_k=split),
                       w8a16_matmul_ref(x, q8.qweight, q8.scales)),
                "w4": (lambda split=None: w4a16_matmul_triton(x, q4.qweight, q4.scales, q4.zeros, group,
                                                             split_k=split),
                       w4a16_matmul_ref(x, q4.qweight, q4.scales, q4.zeros, group)),
            }
            row = {"layer": name, "n": n, "k": k, "m": m, "bf16_ms": ms(lambda: F.linear(x, wb))}
            for label, (fn, ref) in kernels.items():
                out = fn()
                row[f"{label}_err"] = float((out.float() - ref.float()).abs().max() / ref.float().abs().max())
                row[f"{label}_ms"] = ms(fn)
                if not quick:
                    sweep = {s: ms(lambda s=s: fn(s)) for s in splits}
                    best = min(sweep, key=sweep.get)
                    row[f"{label}_best_split"], row[f"{label}_best_ms"] = best, sweep[best]
            rows.append(row)
            print(f"{name:8s} M={m:<3d} bf16 {row['bf16_ms'] * 1e3:8.1f} us  w8 {row['w8_ms'] * 1e3:8.1f} us "
                  f"({row['bf16_ms'] / row['w8_ms']:.2f}x, err {row['w8_err']:.1e})  "
                  f"w4 {row['w4_ms'] * 1e3:8.1f} us ({row['bf16_ms'] / row['w4_ms']:.2f}x, err {row['w4_err']:.1e})",
                  flush=True)
    return rows


def layer_totals(rows: list[dict]) -> list[dict]:
    out = []
    for m in sorted({r["m"] for r in rows}):
        rs = [r for r in rows if r["m"] == m]
        tot = {k: sum(r[k] for r in rs) for k in ("bf16_ms", "w8_ms", "w4_ms")}
        out.append({"m": m, **tot, "w8_speedup": tot["bf16_ms"] / tot["w8_ms"],
                    "w4_speedup": tot["bf16_ms"] / tot["w4_ms"]})
    return out


def decode_steps(model: pathlib.Path, work: pathlib.Path, batches, variants, tokens: int,
                 on_row=None) -> list[dict]:
    import torch

    from inflight.engine import Engine, EngineConfig, SamplingParams
    from inflight.engine.quant.config import QuantConfig
    from inflight.engine.quant.quantize import quantize_model

    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: --smoke plumbing only
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    folders = {"bf16": model}
    known = {"w8": QuantConfig("w8"), "w4-g128": QuantConfig("w4", 128)}
    for label, quant in ((v, known[v]) for v in variants):
        dest = work / f"{model.name}-{label}"
        if not (dest / "config.json").is_file():
            t0 = time.monotonic()
            quantize_model(model, dest, quant, progress=lambda line: None, device=device)
            print(f"quantized {model.name} -> {label} in {time.monotonic() - t0:.0f}s", flush=True)
        folders[label] = dest
    rows = []
    for label, folder in folders.items():
        eng = Engine(EngineConfig(model=folder, dtype="bfloat16", device=device, max_num_seqs=max(batches)))
        for b in batches:
            prompts = [[100 + (7 * i + j) % 40000 for j in range(32)] for i in range(b)]  # 49k vocab
            params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
            eng.generate(prompts[:1], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
            for i, p in enumerate(prompts):
                eng.add_request(f"{label}-{b}-{i}", prompt_token_ids=p, params=params)
            eng.step()  # prefill (+ the first token)
            sync()
            steps, t0 = 0, time.perf_counter()
            while eng.has_unfinished():
                eng.step()
                steps += 1
            sync()
            step_ms = (time.perf_counter() - t0) * 1e3 / max(steps, 1)
            rows.append({"weights": label, "batch": b, "steps": steps, "step_ms": step_ms})
            print(f"decode {label:8s} batch {b:3d}: {step_ms:.2f} ms/step over {steps} steps", flush=True)
            if on_row is not None:
                on_row(rows)
        del eng
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-1b", type=pathlib.Path, help="bf16 1B-shape checkpoint for the decode-step part")
    p.add_argument("--work", type=pathlib.Path, default=pathlib.Path(os.environ.get("OUT", "/tmp")) / "quant-models",
                   help="where the quantized copies go")
    p.add_argument("--quick", action="store_true", help="no split-K sweep")
    p.add_argument("--decode-variants", default="w8,w4-g128", help="quantized copies to decode with")
    p.add_argument("--decode-batches", default="1,16,64")
    p.add_argument("--decode-tokens", type=int, default=64, help="output tokens per request")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under the Triton interpreter")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("bench_quant_gemm: needs a CUDA GPU (use --smoke to check the script on the CPU)")
        return 0
    device = "cpu" if args.smoke else "cuda"
    shapes = SHAPES_SMOKE if args.smoke else SHAPES_1B
    rows = gemms(device, shapes, BATCHES, SPLITS[:2] if args.smoke else SPLITS, args.quick)
    totals = layer_totals(rows)
    print("\none 1B-shape layer (4 GEMMs), microseconds")
    print(f"{'batch':>5}  {'bf16':>9}  {'w8a16':>9}  {'x':>6}  {'w4a16':>9}  {'x':>6}")
    for t in totals:
        print(f"{t['m']:>5}  {t['bf16_ms'] * 1e3:9.1f}  {t['w8_ms'] * 1e3:9.1f}  {t['w8_speedup']:6.2f}  "
              f"{t['w4_ms'] * 1e3:9.1f}  {t['w4_speedup']:6.2f}")
    b1 = next(t for t in totals if t["m"] == 1)
    print(f"targets at batch 1: W8A16 >= 1.5x ({b1['w8_speedup']:.2f}x), W4A16 >= 2.5x ({b1['w4_speedup']:.2f}x)")
    def save(decode: list[dict]) -> None:  # after each part: a time-boxed run keeps what it did
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps({"gemms": rows, "layer": totals,
                                                           "decode": decode}, indent=2))

    save([])
    if args.model_1b:
        batches = [int(b) for b in args.decode_batches.split(",")]
        variants = [v for v in args.decode_variants.split(",") if v]
        decode_steps(args.model_1b, args.work, batches, variants, args.decode_tokens, on_row=save)
    return 0


if __name__ == "__main__":
    sys.exit(main())

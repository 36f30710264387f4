"""Where the CPU forward goes: per op and per layer, at decode batch sizes.

    python benchmarks/forward_profile.py [--model DIR] [--batch-sizes 1,64] [--threads 1]
                                         [--quant w8|w4] [--steps 10] [--aten] [--per-layer]

N requests (random prompts of --prompt-len tokens, greedy) are prefilled, then --steps
decode steps are measured (every request decodes in every step), for each forward of
--paths in turn, in the same run: the CPU forward (engine/cpu_forward.py) with its C++
kernels (native) or its torch ops (torch), and the generic loop (`DecoderModel.forward_hidden`
with the torch kernel set, the baseline). The forward's parts are
timed by wrapping, on this engine only, the kernel functions it calls (norm, rotary and K/V
write (one part, rope_kv, in the CPU forward), attention, activation) and its linear layers (qkv, o, gate_up, down, LM head): each
part's wall ms per step, its share of the forward, its mean per layer, and "other" (the
forward minus its timed parts: embedding, slicing, views, the Python between calls).
`--per-layer` prints each layer's ms; `--aten` adds torch.profiler's table of ATen ops
(self CPU time per step). CPU time of the process is shown beside wall time (the machine
may be shared: say the load average, printed at the end).
"""

from __future__ import annotations

import time
from collections import defaultdict

from common import base_parser, machine_note, model_path, print_table, setup_torch, write_json

LINEARS = ("qkv", "o", "gate_up", "down")
KERNELS = ("rms_norm", "rotary", "write_kv", "rope_kv", "paged_attention", "silu_and_mul")


class PartTimer:
    """Wraps the model's kernel functions and linear layers with wall timers; a part's
    layer is the number of qkv calls seen so far in this forward (qkv opens a layer)."""

    def __init__(self, model):
        import dataclasses

        self.total: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.layer_ms: dict[int, float] = defaultdict(float)
        self.layer = -1
        self.forward_s = self.forward_cpu = 0.0
        # the CPU forward's kernels (engine/cpu_forward.py) when the model takes it, else the
        # kernel set's (the generic loop): rope_kv there is rotary + write_kv here
        attr = "cpu_ops" if getattr(model, "cpu_ops", None) is not None else "ops"
        for name in KERNELS:
            fn = getattr(getattr(model, attr), name, None)
            if fn is None:
                continue
            setattr(model, attr, dataclasses.replace(getattr(model, attr), **{name: self._wrap(name, fn)}))
        if attr == "ops" and model.act.__name__.startswith("silu"):
            model.act = model.ops.silu_and_mul
        for layer in model.layers:
            for name in LINEARS:
                setattr(layer, name, self._wrap(name, getattr(layer, name)))
        compute_logits = model.compute_logits
        self_timer = self

        def timed_logits(h):
            t, c = time.perf_counter(), time.process_time()
            try:
                return compute_logits(h)
            finally:
                self_timer.total["lm_head"] += time.perf_counter() - t
                self_timer.cpu["lm_head"] += time.process_time() - c

        model.compute_logits = timed_logits
        forward = model.forward

        def timed_forward(*a, **kw):
            self_timer.layer = -1
            t, c = time.perf_counter(), time.process_time()
            try:
                return forward(*a, **kw)
            finally:
                self_timer.forward_s += time.perf_counter() - t
                self_timer.forward_cpu += time.process_time() - c

        model.forward = timed_forward

    def _wrap(self, name, fn):
        def timed(*a, **kw):
            if name == "qkv":
                self.layer += 1
            t, c = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **kw)
            finally:
                dt = time.perf_counter() - t
                self.total[name] += dt
                self.cpu[name] += time.process_time() - c
                self.layer_ms[self.layer] += dt * 1e3

        timed.__name__ = getattr(fn, "__name__", name)
        return timed

    def reset(self) -> None:
        self.total.clear()
        self.cpu.clear()
        self.layer_ms.clear()
        self.forward_s = self.forward_cpu = 0.0


def measure(eng, steps: int, aten: bool) -> dict:
    import torch

    timer = PartTimer(eng.model)
    for _ in range(3):
        eng.step()
    timer.reset()
    w, c = time.perf_counter(), time.process_time()
    for _ in range(steps):
        eng.step()
    wall, cpu = time.perf_counter() - w, time.process_time() - c
    parts = {k: v * 1e3 / steps for k, v in timer.total.items()}
    parts_cpu = {k: v * 1e3 / steps for k, v in timer.cpu.items()}
    forward_ms, forward_cpu = timer.forward_s * 1e3 / steps, timer.forward_cpu * 1e3 / steps
    out = dict(step_ms=wall * 1e3 / steps, step_cpu_ms=cpu * 1e3 / steps, forward_ms=forward_ms,
               forward_cpu_ms=forward_cpu, parts=parts, parts_cpu=parts_cpu,
               other_ms=forward_ms - sum(parts.values()),
               other_cpu_ms=forward_cpu - sum(parts_cpu.values()),
               layers=[timer.layer_ms[i] / steps for i in sorted(timer.layer_ms) if i >= 0])
    if aten:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                eng.step()
        rows = sorted(((e.key, e.self_cpu_time_total / 1e3 / steps, e.count // steps)
                       for e in prof.key_averages()), key=lambda r: -r[1])
        out["aten"] = rows[:25]
    del torch
    return out


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", default="1,64")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--quant", default=None,
                   help="profile a quantized copy of the model, a benchmarks/quantization.py variant "
                        "(w8, w4-g32, w4-g128...; made once in $INFLIGHT_CACHE_DIR/quantized)")
    p.add_argument("--aten", action="store_true", help="add torch.profiler's ATen op table")
    p.add_argument("--per-layer", action="store_true", help="print every layer's ms")
    p.add_argument("--paths", default="native,torch,generic",
                   help="forwards to profile, in turn at each batch size: native (engine/cpu_forward.py "
                        "with the C++ kernels, what the engine runs on a CPU), torch (the same forward "
                        "with torch ops only) and generic (the kernel-set loop, the baseline)")
    args = p.parse_args()
    setup_torch(args.threads, args.seed)
    import json

    from step_profile import build_engine, fill

    from inflight.kernels.cpu_ops import TORCH_CPU_OPS

    path = model_path(args.model)
    if args.quant:
        from quantization import quantized_folder

        path = quantized_folder(path, args.quant)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    args.max_num_batched_tokens = 2048
    args.kv_cache_mib = None
    print(f"model {path.name}, {args.dtype}, {args.threads} threads; prompts of {args.prompt_len} "
          f"tokens, {args.steps} measured decode steps", flush=True)
    results = []
    for batch, forward in [(int(b), f) for b in args.batch_sizes.split(",") for f in args.paths.split(",")]:
        eng = build_engine(path, args, batch, None, max_tokens=args.steps * 3 + 64)
        if forward == "generic":
            eng.model.cpu_ops = None
        elif forward == "torch":
            eng.model.cpu_ops = TORCH_CPU_OPS
        fill(eng, batch, args.prompt_len, max_tokens=args.steps * 3 + 64, vocab=vocab, seed=args.seed)
        r = measure(eng, args.steps, args.aten)
        r["batch"], r["path"] = batch, forward
        results.append(r)
        del eng
        f, fc = r["forward_ms"], r["forward_cpu_ms"]
        names = [n for n in (*LINEARS, "lm_head", *KERNELS) if n in r["parts"]]
        n_layers = len(r["layers"]) or 1
        rows = [(n, r["parts"][n], r["parts_cpu"][n], f"{r['parts_cpu'][n] / fc:.1%}",
                 r["parts_cpu"][n] * 1e3 / n_layers if n != "lm_head" else float("nan"))
                for n in names]
        rows.append(("other", r["other_ms"], r["other_cpu_ms"], f"{r['other_cpu_ms'] / fc:.1%}", float("nan")))
        rows.append(("forward", f, fc, "100%", float("nan")))
        print_table(f"{forward} forward, batch {batch}: step {r['step_ms']:.2f} ms wall, {r['step_cpu_ms']:.2f} ms CPU "
                    f"({batch * 1e3 / r['step_ms']:.1f} tok/s)", rows,
                    ("part", "wall ms/step", "CPU ms/step", "CPU share", "CPU us/layer"))
        lay = sorted(r["layers"])
        if lay:
            print(f"layers (timed parts): min {lay[0]:.3f} / median {lay[len(lay) // 2]:.3f} / "
                  f"max {lay[-1]:.3f} ms over {len(lay)} layers")
        if args.per_layer:
            print_table("per layer", [(i, ms) for i, ms in enumerate(r["layers"])], ("layer", "ms/step"))
        if args.aten:
            print_table("ATen ops (self CPU)", r["aten"], ("op", "ms/step", "calls/step"))
    print(machine_note())
    write_json(args.json, {"args": vars(args), "results": results, "machine": machine_note()})


if __name__ == "__main__":
    main()

"""Merge the GPU check's JSON figures into OUT/results.json and OUT/summary.md (tables with
the issue-9 targets beside them).

usage: summarize.py WORK_DIR OUT_DIR   (run by benchmarks/gpu/run_all.sh)
"""

from __future__ import annotations

import json
import pathlib
import sys


def load(work: pathlib.Path) -> dict:
    data = {"stages": []}
    tsv = work / "stages.tsv"
    if tsv.is_file():
        for line in tsv.read_text().splitlines():
            name, rc, secs = line.split("\t")
            data["stages"].append({"stage": name, "rc": rc, "seconds": int(secs)})
    for f in sorted((work / "json").glob("*.json")):
        try:
            data[f.stem] = json.loads(f.read_text())
        except ValueError as exc:
            data[f.stem] = {"error": f"unreadable: {exc}"}
    return data


def table(headers: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out + [""]


def verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("met" if ok else "NOT met")


# (shape, batch) -> (max wall ms/step, min GPU busy): the GPU decode step's targets
STEP_TARGETS = {("1b", 256): (2.5, 0.70), ("1b", 1): (1.5, None), ("135m", 256): (1.5, None)}


def summarize(data: dict) -> list[str]:
    md = ["# GPU check", ""]
    md += table(["stage", "rc", "seconds"],
                [[s["stage"], s["rc"], s["seconds"]] for s in data["stages"]])
    rows = []
    for shape in ("1b", "135m"):
        for r in data.get(f"profile-{shape}", {}).get("results", []):
            if "gpu_ms" not in r:  # CPU (smoke) run: host figures only
                rows.append([shape, "-", r["batch"], f"{r['step_ms']:.2f}", "-", "-",
                             f"{r['tok_s']:.0f}", "-"])
                continue
            target = STEP_TARGETS.get((shape, r["batch"])) if r["cuda_graphs"] else None
            ok = None
            if target:
                ok = r["step_ms"] <= target[0] and (target[1] is None or r["busy"] >= target[1])
            want = (f"<= {target[0]} ms" + (f", busy >= {target[1]:.0%}" if target[1] else "")
                    if target else "")
            rows.append([shape, "on" if r["cuda_graphs"] else "off", r["batch"],
                         f"{r['step_ms']:.2f}", f"{r['gpu_ms']:.3f}", f"{r['busy']:.0%}",
                         f"{r['tok_s']:.0f}", f"{want} {verdict(ok)}".strip()])
    md += ["## Decode step (benchmarks/step_profile.py)", ""]
    md += table(["shape", "CUDA graphs", "sequences", "wall ms/step", "GPU kernel ms/step",
                 "GPU busy", "tok/s", "target"], rows)
    rows = []
    for shape in ("1b", "135m"):
        t = data.get(f"throughput-{shape}")
        if not t or "engine" not in t:
            continue
        e, h = t["engine"], t.get("hf") or {}
        ratio = t.get("ratio")
        on_gpu = str(t.get("args", {}).get("device", "")).startswith("cuda")
        ok = ratio >= 20 if h and on_gpu else None
        rows.append([shape, e.get("output_tokens"), f"{e['tok_s']:.0f}", f"{e['wall_s']:.1f}",
                     h.get("requests", "-"), f"{h['tok_s']:.0f}" if h else "-",
                     f"{ratio:.1f}x" if h else "-", f">= 20x {verdict(ok)}"])
    md += ["## Throughput vs HF static batching (benchmarks/throughput.py)", ""]
    md += table(["shape", "engine output tokens", "engine tok/s", "engine wall s",
                 "HF requests", "HF tok/s", "ratio", "target"], rows)
    k = data.get("kernels", {})
    rows = []
    for r in k.get("rows", []):
        if r.get("kernel") != "attention decode" or not r.get("graph_ms"):
            continue
        base = r.get("torch_graph_ms")
        ok = None
        if r["batch"] == 1 and r["context"] >= 2048:
            ok = r["graph_pct_peak"] >= 40 and (base is None or base >= r["graph_ms"])
        elif base:
            ok = base >= r["graph_ms"]
        rows.append([r["shape"], f"{r['triton_ms']:.4f}", f"{r['graph_ms']:.4f}",
                     f"{r['graph_pct_peak']:.1f}%", f"{base:.4f}" if base else "-",
                     f"{base / r['graph_ms']:.2f}x" if base else "-", verdict(ok)])
    md += ["## Decode attention (benchmarks/bench_kernels.py --quick)", "",
           "Targets: B=1 at ctx >= 2k reaches 40% of HBM; no decode shape loses to torch.", ""]
    md += table(["shape", "eager ms", "graph ms", "% HBM (graph)", "torch graph ms",
                 "speedup", "target"], rows)
    md += kv8_section(data.get("kv8", {}))
    md += quant_section(data.get("quant", {}))
    md += families_section(data)
    md += tp_section(data.get("tensor-parallel", {}))
    md += spec_section(data.get("spec-verify", {}), data.get("spec-decode", {}))
    return md


def kv8_section(k: dict) -> list[str]:
    """8-bit KV caches (issue 24): the Triton kernels on int8 / fp8 caches vs the bf16 cache."""
    rows = [[r["kernel"], r["shape"], f"{r['triton_ms']:.4f}", f"{r['torch_ms']:.4f}",
             f"{r['speedup']:.2f}x", f"{r['pct_peak']:.1f}%"] for r in k.get("rows", [])]
    if not rows:
        return []
    md = ["## 8-bit KV cache (benchmarks/bench_kernels.py --kv-only --kv-cache-dtypes int8,fp8)", "",
          "CUDA-graph replay; the baseline is the same kernel on the bf16 cache.", ""]
    return md + table(["kernel", "shape", "8-bit ms", "bf16 ms", "speedup", "% HBM (8-bit bytes)"], rows)


def spec_section(v: dict, d: dict) -> list[str]:
    """Speculative decoding (issue 20): the verification step against a plain decode step,
    and tok/s with and without on repetitive prompts."""
    md = ["## Speculative decoding (benchmarks/spec_verify.py, spec_decode.py)", "",
          "Target: a verification step with k = 4 at batch 1 on the 1B shape <= 1.3x a plain "
          "decode step.", ""]
    rows = []
    for r in v.get("results", []):
        ok = r["vs_plain"] <= 1.3 if (r["batch"], r["k"]) == (1, 4) else None
        rows.append([r["batch"], r["kind"], f"{r['median_ms']:.3f}", f"{r['vs_plain']:.2f}x", verdict(ok)])
    md += table(["batch", "step", "median ms", "vs plain", "target"], rows)
    rows = [[r["workload"], r["batch"], r["method"], f"{r['tok_s']:.0f}", f"{r['speedup_wall']:.2f}x",
             "-" if r["acceptance"] != r["acceptance"] else f"{r['acceptance']:.2f}",
             f"{r['identical']}/{r['requests']}"] for r in d.get("results", [])]
    md += table(["workload", "batch", "method", "tok/s", "speedup (wall)", "acceptance", "identical"], rows)
    return md


def families_section(data: dict) -> list[str]:
    md = ["## Model families (tests/engine/test_families.py; real shapes through throughput.py)", ""]
    rows = [[s["stage"], "passed" if s["rc"] == "0" else f"rc {s['rc']}", s["seconds"]]
            for s in data["stages"] if s["stage"].startswith("families-exact-")]
    md += table(["exactness stage", "result", "seconds"], rows)
    rows = []
    for key in sorted(k for k in data if k.startswith("family-")):
        t = data[key]
        if "engine" not in t:
            continue
        e, h = t["engine"], t.get("hf") or {}
        rows.append([key[len("family-"):], e.get("output_tokens"), f"{e['tok_s']:.0f}",
                     f"{h['tok_s']:.0f}" if h else "-", f"{t['ratio']:.1f}x" if h else "-"])
    md += table(["shape (fewer layers)", "engine output tokens", "engine tok/s", "HF tok/s", "ratio"], rows)
    return md


def tp_section(t: dict) -> list[str]:
    """TP=1 through the tensor-parallel code path (mp@1) against the plain engine (uni):
    the plumbing's cost per decode step, which must be about 0."""
    md = ["## Tensor-parallel plumbing at TP=1 (benchmarks/tensor_parallel.py)", "",
          "Target: mp@1 - uni about 0 ms per decode step; tokens identical.", ""]
    rows = []
    for r in t.get("results", []):
        extra, cpu = r.get("plumbing_decode_ms"), r.get("plumbing_decode_cpu_ms")
        rows.append([r["model"], r["config"], r["tokens_identical"], f"{r['decode_ms']:.3f}",
                     f"{r['decode_cpu_ms']:.3f}", f"{r['prefill_ms']:.2f}",
                     "-" if extra is None else f"{extra:+.3f}", "-" if cpu is None else f"{cpu:+.3f}"])
    return md + table(["model", "config", "tokens = uni", "decode ms/step", "host CPU ms/step",
                       "prefill ms/step", "plumbing ms/step", "plumbing CPU ms/step"], rows)


# quantized GEMMs, at batch 1 over the 1B shape's layer: (W8A16, W4A16) speedup over bf16 cuBLAS
QUANT_TARGETS = {"w8_speedup": 1.5, "w4_speedup": 2.5}


def quant_section(q: dict) -> list[str]:
    md = ["## Quantized GEMMs, 1B shape, one layer (benchmarks/bench_quant_gemm.py)", "",
          "Microseconds per layer (q|k|v, o, gate|up, down), CUDA-graph replay. Targets at "
          "batch 1: W8A16 >= 1.5x, W4A16 >= 2.5x bf16.", ""]
    rows = []
    for t in q.get("layer", []):
        marks = []
        for key, want in QUANT_TARGETS.items():
            marks.append(f"{t[key]:.2f}x" + (f" (>= {want}x {verdict(t[key] >= want)})" if t["m"] == 1 else ""))
        rows.append([t["m"], f"{t['bf16_ms'] * 1e3:.1f}", f"{t['w8_ms'] * 1e3:.1f}", marks[0],
                     f"{t['w4_ms'] * 1e3:.1f}", marks[1]])
    md += table(["batch", "bf16 us", "W8A16 us", "W8A16 vs bf16", "W4A16 us", "W4A16 vs bf16"], rows)
    errs = [max(r.get("w8_err", 0), r.get("w4_err", 0)) for r in q.get("gemms", [])]
    if errs:
        md += [f"Largest relative error against the torch references: {max(errs):.1e}", ""]
    rows = [[d["weights"], d["batch"], f"{d['step_ms']:.2f}", d["steps"]] for d in q.get("decode", [])]
    md += ["## Decode steps, 1B shape, bf16 vs quantized weights", ""]
    md += table(["weights", "sequences", "ms/step", "steps"], rows)
    return md


def main() -> int:
    work, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    data = load(work)
    (out / "results.json").write_text(json.dumps(data, indent=1, default=str))
    md = "\n".join(summarize(data))
    (out / "summary.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

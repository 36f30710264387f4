"""Speculative decoding on the default model: tok/s with and without it, in one run.

    .venv/bin/python benchmarks/spec_decode.py [--workloads grounded,chat,similar]
        [--batches 1,8,32] [--methods ngram,suffix,draft,self] [--k 4] [--json out.json]

Workloads (chat-templated, greedy, EOS ends a request, `--max-tokens` caps it):
  grounded    copy / correct / extract / quote from a given passage (4 tasks x 4 passages)
  chat        open questions, nothing to copy from
  similar     64 similar requests (a record turned into JSON): the suffix cache's case
  repetitive  a phrase repeated (the GPU check, on random weights)
Methods: ngram (prompt lookup, k = --k, --prompt-lookup-min..4-grams), suffix (own context + the outputs of
earlier requests), draft (a draft model: the target's first --draft-layers layers, same
tokenizer), self (the target as its own draft: acceptance 1.0, the cost of verification).
Batch B: max_num_seqs = B, all requests submitted at once (B = 1: one at a time); each
(workload, batch) takes the first max(B, --min-requests) requests of the workload. At
B = 1 "decoding CPU" / "decoding wall" leave the prefill out: tokens after each request's
first over the CPU / wall time of the steps after its first token (the rate speculation
changes; prefill costs both sides the same). The
plain engine runs first and last (against load drift; the faster run counts), each method
in between; speedup = plain CPU time / speculative CPU time (one torch thread: CPU time is
the steadier measure on a shared machine; wall figures are printed too). Speculation uses
the config's default disable_by_batch_size unless --threshold is given. "identical" counts
requests whose tokens equal the plain run's.
"""

from __future__ import annotations

import json
import pathlib
import random
import shutil
import tempfile
import time

from common import Timer, base_parser, machine_note, model_path, print_table, setup_torch, write_json

PASSAGES = [
    "The lighthouse stood on a narrow spit of rock at the mouth of the harbour. For more than a "
    "century its keepers climbed the one hundred and twelve steps every evening to light the lamp, "
    "and every morning they climbed them again to put it out. In 1921 the lamp was replaced by an "
    "electric one, and in 1958 the last keeper, a man named Thomas Reed, locked the door for the "
    "final time. Today the tower is a museum, and visitors can still climb the steps to see the view.",
    "Bread is made from flour, water, salt and yeast. The yeast feeds on the sugars in the flour and "
    "releases carbon dioxide, which is trapped by the gluten and makes the dough rise. A long, slow "
    "rise at a cool temperature gives the bread more flavour. Most loaves are baked at about 230 "
    "degrees Celsius for 35 to 45 minutes, until the crust is brown and the base sounds hollow.",
    "The city council met on Tuesday to discuss the new bus routes. Under the plan, route 7 will run "
    "every ten minutes during the morning rush, and a new route 12 will connect the hospital with the "
    "train station. The changes are expected to cost 2.4 million euros a year. The council will vote "
    "on the plan in March, after a public consultation that runs until the end of February.",
    "Honey bees live in colonies of up to sixty thousand workers and a single queen. The workers "
    "collect nectar and pollen, build the wax comb and look after the young. A worker bee lives for "
    "about six weeks in summer, but bees born in autumn can survive the whole winter. To tell others "
    "where food is, a bee performs a waggle dance whose angle shows the direction of the flowers.",
]
TYPOS = {"the ": "teh ", "which": "wich", "every": "evrey", "about": "abuot", "their": "thier",
         "morning": "mornign", "flavour": "flavor", "council": "counsil", "colonies": "colonys"}
QUESTIONS = [
    "What are three good habits for staying healthy?", "Why is the sky blue?",
    "Give me some ideas for a birthday party.", "How do I start learning to play the guitar?",
    "What is the difference between weather and climate?", "Write a short poem about the sea.",
    "What should I pack for a weekend camping trip?", "Explain how a bicycle works.",
]
NAMES = ["Alice", "Bob", "Carla", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas",
         "Kofi", "Lena", "Mateo", "Nora", "Omar", "Priya"]
CITIES = ["Lisbon", "Oslo", "Nairobi", "Lima", "Osaka", "Quebec", "Porto", "Dublin"]


def grounded_tasks() -> list[str]:
    out = []
    for text in PASSAGES:
        wrong = text
        for a, b in TYPOS.items():
            wrong = wrong.replace(a, b)
        first = text.split(". ")[1]
        out += [f"Repeat the following text exactly, word for word:\n\n{text}",
                f"Correct the spelling mistakes in this text and write out the corrected text in full:\n\n{wrong}",
                f"From the text below, extract every sentence that contains a number.\n\n{text}",
                f"Quote the sentence of the text below that begins with \"{first[:20]}\".\n\n{text}"]
    return out


def similar_tasks(n: int = 64) -> list[str]:
    rng = random.Random(0)
    return [f"Turn this record into a JSON object with the keys name, age, city and job: "
            f"{rng.choice(NAMES)}, {rng.randint(18, 90)} years old, lives in {rng.choice(CITIES)}, "
            f"works as a {rng.choice(['teacher', 'nurse', 'pilot', 'baker', 'engineer', 'farmer'])}."
            for _ in range(n)]


def repetitive_tasks(n: int = 32) -> list[str]:
    """A phrase said over and over (random weights continue a loop often enough for n-gram
    drafts to be accepted: the GPU check's case)."""
    rng = random.Random(1)
    words = PASSAGES[0].split()
    out = []
    for _ in range(n):
        start = rng.randrange(len(words) - 8)
        out.append("Say this again and again: " + " ".join(words[start:start + 8] * 6))
    return out


WORKLOADS = {"grounded": grounded_tasks, "chat": lambda: QUESTIONS, "similar": similar_tasks,
             "repetitive": repetitive_tasks}


def truncated_draft(target: pathlib.Path, layers: int, out: pathlib.Path) -> pathlib.Path:
    """The target's first `layers` decoder layers, its embeddings, final norm and head."""
    import torch
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in target.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    cfg = json.loads((target / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    (out / "config.json").write_text(json.dumps(cfg))
    kept = {}
    for f in sorted(target.glob("*.safetensors")):
        for name, w in load_file(str(f)).items():
            parts = name.split(".")
            if "layers" in parts and int(parts[parts.index("layers") + 1]) >= layers:
                continue
            kept[name] = w.to(torch.float32).contiguous()
    save_file(kept, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def spec_config(method: str, args, path: pathlib.Path, draft: pathlib.Path | None) -> dict | None:
    extra = {} if args.threshold is None else {"disable_by_batch_size": args.threshold or None}
    if method == "plain":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": args.prompt_lookup_min,
                "prompt_lookup_max": 4, **extra}
    if method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": max(args.k, 8), **extra}
    model = draft if method == "draft" else path
    return {"method": "draft_model", "model": str(model), "num_speculative_tokens": args.k, **extra}


def steps(eng, ids, params) -> tuple[list, float, float]:
    """Run the requests to the end, step by step: (final outputs, CPU s, wall s of the
    decoding steps). A decoding step emits tokens, all of requests that had emitted before:
    the steps that prefill (and emit a request's first token) are left out, which at batch 1
    (one request at a time) leaves exactly the decoding."""
    for i, p in enumerate(ids):
        eng.add_request(f"r{i}", prompt_token_ids=p, params=params)
    finals, seen, cpu, wall = {}, set(), 0.0, 0.0
    while eng.has_unfinished():
        c0, w0 = time.process_time(), time.perf_counter()
        outs = eng.step()
        c1, w1 = time.process_time(), time.perf_counter()
        emitted = {o.request_id for o in outs if o.new_token_ids}
        if emitted and emitted <= seen:
            cpu, wall = cpu + c1 - c0, wall + w1 - w0
        seen |= emitted
        finals.update((o.request_id, o) for o in outs if o.finished)
    return [finals[f"r{i}"] for i in range(len(ids))], cpu, wall


def run(path, method, prompts, batch, args, draft) -> dict:
    from inflight.engine import Engine, EngineConfig, SamplingParams

    eng = Engine(EngineConfig(model=path, dtype=args.dtype, device=args.device, max_num_seqs=batch,
                              kv_cache_bytes=args.kv_cache_mib << 20, seed=args.seed,
                              speculative_config=spec_config(method, args, path, draft)))
    tok = eng.tokenizer
    ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]), add_special_tokens=False)
           for p in prompts]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    eng.generate([ids[0][:16]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))  # warm-up
    base = eng.stats()
    with Timer() as t:
        outs, decode_cpu, decode_wall = steps(eng, ids, params)
    s = eng.stats()
    n_out = sum(len(o.token_ids) for o in outs)
    d = lambda key: s.get(key, 0) - base.get(key, 0)  # noqa: E731
    drafts, draft_tokens, accepted = d("spec_decode_num_drafts"), d("spec_decode_num_draft_tokens"), \
        d("spec_decode_num_accepted_tokens")
    return {"method": method, "batch": batch, "requests": len(ids), "output_tokens": n_out,
            "wall_s": t.elapsed, "cpu_s": t.cpu, "tok_s": n_out / t.elapsed, "tok_per_cpu_s": n_out / t.cpu,
            "decode_tok_per_cpu_s": (n_out - len(outs)) / decode_cpu if decode_cpu > 0 else float("nan"),
            "decode_tok_s": (n_out - len(outs)) / decode_wall if decode_wall > 0 else float("nan"),
            "steps": d("steps"), "acceptance": accepted / draft_tokens if draft_tokens else float("nan"),
            "mean_accepted_len": 1 + accepted / drafts if drafts else float("nan"),
            "verifications": drafts, "token_ids": [o.token_ids for o in outs]}


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--workloads", default="grounded,chat,similar")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--methods", default="ngram,suffix,draft,self")
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens (suffix: at least 8)")
    p.add_argument("--prompt-lookup-min", type=int, default=2, help="ngram: shortest suffix matched")
    p.add_argument("--threshold", type=int, default=None,
                   help="disable_by_batch_size (default: the config's; 0 = never disabled)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--min-requests", type=int, default=8, help="requests per (workload, batch) at least")
    p.add_argument("--draft-layers", type=int, default=8)
    p.add_argument("--kv-cache-mib", type=int, default=1024)
    args = p.parse_args()
    setup_torch(args.threads, args.seed)
    path = model_path(args.model)
    methods = [m for m in args.methods.split(",") if m]
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="spec-draft-"))
    draft = truncated_draft(path, args.draft_layers, tmp / "draft") if "draft" in methods else None
    print(f"model {path.name}, {args.dtype} on {args.device}, {args.threads} threads, k={args.k}, "
          f"max_tokens={args.max_tokens}", flush=True)
    results = []
    for workload in args.workloads.split(","):
        tasks = WORKLOADS[workload]()
        for batch in map(int, args.batches.split(",")):
            n = max(batch, args.min_requests)
            prompts = [tasks[i % len(tasks)] for i in range(n)]
            runs = [run(path, "plain", prompts, batch, args, draft)]
            for m in methods:
                runs.append(run(path, m, prompts, batch, args, draft))
                print(f"  {workload} batch {batch} {m}: {runs[-1]['cpu_s']:.1f} CPU s", flush=True)
            runs.append(run(path, "plain", prompts, batch, args, draft))
            plain = min((runs[0], runs[-1]), key=lambda r: r["cpu_s"])
            rows = []
            for r in [plain] + runs[1:-1]:
                same = sum(a == b for a, b in zip(r["token_ids"], plain["token_ids"]))
                r.update(workload=workload, identical=same, speedup_cpu=plain["cpu_s"] / r["cpu_s"],
                         speedup_wall=plain["wall_s"] / r["wall_s"],
                         speedup_decode_cpu=r["decode_tok_per_cpu_s"] / plain["decode_tok_per_cpu_s"],
                         speedup_decode_wall=r["decode_tok_s"] / plain["decode_tok_s"])
                rows.append((r["method"], r["requests"], r["output_tokens"], r["tok_per_cpu_s"], r["tok_s"],
                             f"{r['speedup_cpu']:.2f}x", f"{r['speedup_wall']:.2f}x",
                             *((f"{r['speedup_decode_cpu']:.2f}x", f"{r['speedup_decode_wall']:.2f}x")
                               if batch == 1 else ("-", "-")), r["acceptance"],
                             r["mean_accepted_len"], f"{same}/{r['requests']}"))
                results.append({k: v for k, v in r.items() if k != "token_ids"})
            print_table(f"{workload}, batch {batch}", rows,
                        ("method", "requests", "out tokens", "tok/CPU s", "tok/s wall", "speedup CPU",
                         "speedup wall", "decoding CPU", "decoding wall", "acceptance", "mean acc len",
                         "identical"))
    shutil.rmtree(tmp, ignore_errors=True)
    print(machine_note())
    write_json(args.json, {"results": results, "machine": machine_note(), "args": vars(args)})


if __name__ == "__main__":
    main()

"""Structured outputs: validity, decode cost and compile time, on the default model (CPU).

    python benchmarks/structured.py [--model DIR] [--batch-sizes 1,32,64] [--steps 12]
                                    [--per-kind 6] [--max-tokens 160] [--json PATH]

1. Validity: a suite of constraints (JSON schemas with enums, nested objects, arrays with
   bounds, string patterns, numbers with ranges; a regex; a choice), --per-kind chat
   prompts each (half greedy, half sampled at temperature 0.8 with seeds), run as one
   batch. Per kind: outputs that stopped (the grammar completed), and the share of those
   that parse and validate (`jsonschema`, `re.fullmatch`, membership); outputs that hit
   max_tokens inside the JSON are counted apart.
2. Decode cost: B requests decode --steps steps, every request in every step, without and
   with a constraint (a JSON array of objects long enough not to end in the measured
   steps), in the same run, the two engines stepping in turn: median step ms (wall, and
   this thread's CPU: steadier on a loaded machine), output tok/s, the constrained step's
   extra time as a share of its step, and the host µs per constrained sequence per step
   (filling its token bitmask; the mask is applied on the device inside the step).
3. Compile: each schema compiled cold (a fresh compiler, its tokenizer built first, timed
   apart), the first mask after it (llguidance builds its lexer lazily), and the cached
   path (the same constraint again: a cache hit and a matcher copy).
"""

from __future__ import annotations

import json
import re
import time

from common import base_parser, machine_note, model_path, print_table, setup_torch, write_json

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "email"],
          "properties": {"name": {"type": "string", "maxLength": 40},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "email": {"type": "string", "pattern": "^[a-z0-9.]{1,20}@[a-z]{2,12}\\.(com|org)$"}}}
SUITE = {
    "enum": {"type": "object", "additionalProperties": False, "required": ["sentiment", "confidence"],
             "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]},
                            "confidence": {"enum": ["low", "medium", "high"]}}},
    "nested": {"type": "object", "additionalProperties": False, "required": ["user", "address"],
               "properties": {"user": PERSON,
                              "address": {"type": "object", "additionalProperties": False,
                                          "required": ["city", "zip"],
                                          "properties": {"city": {"type": "string", "maxLength": 30},
                                                         "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}}},
    "array": {"type": "object", "additionalProperties": False, "required": ["tags"],
              "properties": {"tags": {"type": "array", "minItems": 2, "maxItems": 4,
                                      "items": {"type": "string", "maxLength": 15}}}},
    "pattern": {"type": "object", "additionalProperties": False, "required": ["date", "code"],
                "properties": {"date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"},
                               "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}}},
    "numbers": {"type": "object", "additionalProperties": False, "required": ["price", "quantity", "rating"],
                "properties": {"price": {"type": "number", "minimum": 0, "maximum": 1000},
                               "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                               "rating": {"type": "number", "minimum": 1, "maximum": 5}}},
}
REGEX = r"(Mon|Tue|Wed|Thu|Fri) [0-2][0-9]:[0-5][0-9]"
CHOICES = ["positive", "negative", "neutral"]
PROMPTS = ["Describe a customer who just bought a laptop.", "Summarize this review: the soup was cold.",
           "Give me the details of a shipment to Paris.", "Tag this article about football.",
           "When is the next team meeting?", "Rate the movie Inception.",
           "Create a record for an order of three books.", "What is the mood of: I love rainy days?"]
LONG = {"type": "array", "minItems": 200, "items": PERSON}  # never ends within --steps


def kinds():
    out = {name: ({"json": schema}, schema) for name, schema in SUITE.items()}
    out["regex"] = ({"regex": REGEX}, None)
    out["choice"] = ({"choice": CHOICES}, None)
    return out


def valid(kind: str, check, text: str) -> bool:
    import jsonschema

    try:
        if kind == "regex":
            return re.fullmatch(REGEX, text) is not None
        if kind == "choice":
            return text in CHOICES
        jsonschema.validate(json.loads(text), check)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def validity(engine, args) -> list[tuple]:
    from inflight.engine import SamplingParams

    jobs = []
    for kind, (so, check) in kinds().items():
        for i in range(args.per_kind):
            greedy = i % 2 == 0
            p = SamplingParams(max_tokens=args.max_tokens, temperature=0.0 if greedy else 0.8,
                               seed=None if greedy else args.seed + i, structured_outputs=so)
            msg = [{"role": "user", "content": PROMPTS[i % len(PROMPTS)] + " Answer in JSON."
                    if kind not in ("regex", "choice") else PROMPTS[i % len(PROMPTS)]}]
            rid = f"{kind}-{i}"
            engine.add_request(rid, messages=msg, params=p)
            jobs.append((rid, kind, check))
    finals = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    rows = []
    for kind in kinds():
        mine = [(finals[rid], check) for rid, k, check in jobs if k == kind]
        stopped = [(o, c) for o, c in mine if o.finish_reason == "stop"]
        ok = sum(valid(kind, c, o.text) for o, c in stopped)
        rows.append((kind, len(mine), len(stopped), len(mine) - len(stopped),
                     f"{ok}/{len(stopped)}", 100.0 * ok / len(stopped) if stopped else float("nan"),
                     repr(stopped[0][0].text[:60]) if stopped else "-"))
    return rows


def _filled(path, args, batch: int, so):
    """An engine with `batch` requests, every one of them decoding."""
    from inflight.engine import Engine, EngineConfig, SamplingParams

    eng = Engine(EngineConfig(model=path, max_num_seqs=batch, enable_prefix_caching=False,
                              num_kv_blocks=batch * 24, seed=args.seed, device=args.device,
                              dtype=args.dtype))
    params = SamplingParams(max_tokens=args.steps + 8, temperature=0.0, ignore_eos=True,
                            structured_outputs=so)
    for i in range(batch):
        eng.add_request(str(i), messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                        params=params)
    while eng.scheduler.waiting or eng.grammars.waiting or \
            any(r.num_output_tokens < 2 for r in eng.requests.values()):
        eng.step()
    return eng


def decode_cost(path, args, batch: int) -> dict:
    """Median step ms (wall and this thread's CPU) and host µs per constrained sequence per
    step, free vs constrained. NOTE: the two engines step in turn, so a change of the
    machine's load hits both alike."""
    import statistics

    import torch

    engines = {"free": _filled(path, args, batch, None),
               "constrained": _filled(path, args, batch, {"json": LONG})}
    m = engines["constrained"].runner.bitmasks
    host0, cpu0, rows0 = m.host_s, m.host_cpu_s, m.rows
    times = {k: ([], []) for k in engines}
    toks = dict.fromkeys(engines, 0)
    for _ in range(args.steps):
        for mode, eng in engines.items():
            t0, c0 = time.perf_counter(), time.thread_time()
            toks[mode] += sum(len(o.new_token_ids) for o in eng.step())
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            times[mode][0].append(time.perf_counter() - t0)
            times[mode][1].append(time.thread_time() - c0)
    for eng in engines.values():
        assert len(eng.requests) == batch, "a request ended inside the measured steps"
    out = {}
    for mode in engines:
        wall, cpu = times[mode]
        out[mode] = {"step_ms": 1e3 * statistics.median(wall), "cpu_ms": 1e3 * statistics.median(cpu),
                     "tok_s": toks[mode] / sum(wall)}
    out["constrained"]["host_us"] = 1e6 * (m.host_s - host0) / max(m.rows - rows0, 1)
    out["constrained"]["host_cpu_us"] = 1e6 * (m.host_cpu_s - cpu0) / max(m.rows - rows0, 1)
    return out


def compile_times(path) -> list[tuple]:
    from inflight.engine.grammar import GrammarCompiler
    from inflight.engine.structured_outputs import StructuredOutputs
    from inflight.engine.tokenizer import Tokenizer

    tok = Tokenizer(path)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    rows = []
    compiler = GrammarCompiler(tok, vocab, tok.eos_token_ids)
    t0 = time.perf_counter()
    _ = compiler.tokenizer
    rows.append(("(tokenizer, once per engine)", 1e3 * (time.perf_counter() - t0), "-", "-"))
    import numpy as np

    from inflight.engine.grammar import GrammarMatcher, fill_bitmasks

    words = compiler.words_per_row()
    buf = np.zeros((1, words), dtype=np.int32)
    for kind, (so, _) in kinds().items():
        spec = StructuredOutputs(**so)
        t0 = time.perf_counter()
        template = compiler.submit(spec.kind, spec.key).result()
        cold = time.perf_counter() - t0
        m = GrammarMatcher(template)
        t0 = time.perf_counter()
        fill_bitmasks(compiler.executor, [(m, 0)], buf.ctypes.data, words, 1)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        GrammarMatcher(compiler.submit(spec.kind, spec.key).result())
        cached = time.perf_counter() - t0
        rows.append((kind, 1e3 * cold, 1e3 * first, 1e6 * cached))
    compiler.close()
    return rows


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", default="1,32,64")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--per-kind", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--skip-validity", action="store_true")
    args = p.parse_args()
    setup_torch(args.threads, args.seed)
    path = model_path(args.model)
    from inflight.engine import Engine, EngineConfig

    result: dict = {"machine": machine_note()}
    comp = compile_times(path)
    print_table("compile (ms cold, ms first mask, µs cached: a cache hit + a matcher copy)", comp,
                ("constraint", "cold ms", "first mask ms", "cached µs"))
    result["compile"] = comp
    if not args.skip_validity:
        eng = Engine(EngineConfig(model=path, max_num_seqs=64, seed=args.seed, device=args.device,
                                  dtype=args.dtype))
        rows = validity(eng, args)
        print_table(f"validity ({args.per_kind} prompts per kind, max_tokens {args.max_tokens}, "
                    "half greedy, half sampled)", rows,
                    ("kind", "outputs", "stopped", "hit max_tokens", "valid/stopped", "% valid", "first"))
        result["validity"] = rows
    cost = []
    for b in (int(x) for x in args.batch_sizes.split(",")):
        c = decode_cost(path, args, b)
        f, s = c["free"], c["constrained"]
        extra = 100.0 * (s["step_ms"] - f["step_ms"]) / s["step_ms"]
        cost.append((b, f["step_ms"], s["step_ms"], f["tok_s"], s["tok_s"], extra,
                     100.0 * (s["cpu_ms"] - f["cpu_ms"]) / s["cpu_ms"], s["host_us"],
                     s["host_cpu_us"]))
        result.setdefault("decode", {})[b] = c
    print_table(f"decode cost ({args.steps} steps, every request decoding; JSON array constraint)", cost,
                ("batch", "free step ms", "constrained step ms", "free tok/s", "constrained tok/s",
                 "extra % of step (wall)", "extra % of step (CPU)", "host µs / seq / step",
                 "host CPU µs / seq / step"))
    print(f"\n{machine_note()}")
    write_json(args.json, result)


if __name__ == "__main__":
    main()

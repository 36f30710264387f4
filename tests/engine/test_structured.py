"""Structured outputs in the engine: every constrained output of a random model parses and
validates (the mask alone keeps it valid), on the tiny model's tokenizer and on the default
model's; the same outputs through overlapped, padded, chunked, preempted and prefix-cached
steps; compiles that fail or take long never stop or stall the engine."""

from __future__ import annotations

import json
import re
import time

import jsonschema
import pytest
import torch

from inflight.engine import Engine, EngineConfig, SamplingParams, StructuredOutputs
from inflight.engine.errors import ERR_INVALID_SCHEMA
from tests.tiny_llama import write_tiny_llama

PERSON = {"type": "object", "additionalProperties": False,
          "required": ["name", "age", "role", "tags", "address"],
          "properties": {
              "name": {"type": "string", "minLength": 1, "maxLength": 12},
              "age": {"type": "integer", "minimum": 0, "maximum": 130},
              "role": {"enum": ["admin", "user", "guest"]},
              "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,6}$"},
                       "minItems": 1, "maxItems": 3},
              "address": {"type": "object", "required": ["zip"], "additionalProperties": False,
                          "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                                         "score": {"type": "number", "minimum": -1.5,
                                                   "maximum": 2.5}}}}}
REGEX = r"[A-Z]{2}-[0-9]{3,4}( [a-z]{1,8})?"
CHOICES = ["positive", "negative", "neutral", "mixed feelings"]
GBNF = 'root ::= "yes" | "no" | "maybe" " " [0-9]'
LARK = 'start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,3}/'

SUITE = [({"json": PERSON}, lambda t: jsonschema.validate(json.loads(t), PERSON)),
         ({"json_object": True}, lambda t: _is_dict(json.loads(t))),
         ({"regex": REGEX}, lambda t: _check(re.fullmatch(REGEX, t))),
         ({"choice": CHOICES}, lambda t: _check(t in CHOICES)),
         ({"grammar": GBNF}, lambda t: _check(re.fullmatch(r"yes|no|maybe [0-9]", t))),
         ({"grammar": LARK}, lambda t: _check(re.fullmatch(r"\([0-9]{1,3}(,[0-9]{1,3})*\)", t)))]
SAMPLING = [dict(temperature=0.0), dict(temperature=1.0, seed=7),
            dict(temperature=0.8, top_k=20, top_p=0.9, seed=3), dict(temperature=1.3)]


def _check(ok) -> None:
    assert ok


def _is_dict(value) -> None:
    assert isinstance(value, dict)


@pytest.fixture(scope="module")
def smol_tokenizer_model(tmp_path_factory):
    """A random 1-layer model with the default model's tokenizer (49k byte-level BPE)."""
    from inflight.engine.model_folder import ensure_default_model
    from inflight.schemas import Settings

    src = ensure_default_model(Settings().cache_dir)
    return write_tiny_llama(tmp_path_factory.mktemp("smol-tok"), num_layers=1, hidden_size=32,
                            num_heads=2, num_kv_heads=1, tokenizer_from=src)


def _run_suite(engine, max_tokens=160, prompts=("the quick brown fox", "hello world"),
               sampling=SAMPLING):
    params, checks = [], []
    for so, check in SUITE:
        for kw in sampling:
            params.append(SamplingParams(max_tokens=max_tokens, structured_outputs=so, **kw))
            checks.append(check)
    outs = engine.generate([prompts[i % len(prompts)] for i in range(len(params))], params)
    stopped = set()  # suite entries with a stopped output
    for i, (out, check, p) in enumerate(zip(outs, checks, params)):
        assert out.finish_reason in ("stop", "length"), (out.finish_reason, out.error)
        if out.finish_reason == "stop":
            stopped.add(i // len(sampling))
            try:
                check(out.text)
            except Exception as exc:  # noqa: BLE001 - say which output
                raise AssertionError(f"{p.structured_outputs.kind} {out.text!r}: {exc}") from exc
    return outs, stopped


@pytest.mark.parametrize("model", ["tiny", "smol"])
def test_every_stopped_constrained_output_validates(model, tiny_model_path, request):
    path = tiny_model_path if model == "tiny" else request.getfixturevalue("smol_tokenizer_model")
    engine = Engine(EngineConfig(model=path, num_kv_blocks=512, debug_checks=True))
    # a 49k vocabulary: fewer rows of the costly vocab-wide draws
    outs, stopped = _run_suite(engine, *(() if model == "tiny" else (80, ("hi",), SAMPLING[:3])))
    # a random model may write an unbounded string or repetition until max_tokens; every
    # kind of constraint still ends (and validates) for some of the sampling settings, but
    # for any JSON object (unbounded keys) on a 49k vocabulary, where a closing quote is
    # one of ~40k allowed tokens
    assert stopped >= set(range(len(SUITE))) - ({1} if model == "smol" else set())
    st = engine.stats()
    assert st["grammar_compiles"] == len(SUITE) and st["grammar_masks"] > 0


def test_the_default_model_answers_valid_structures():
    """The real SmolLM2-135M weights, greedy, chat prompts: every output stops and validates."""
    from inflight.engine.model_folder import ensure_default_model
    from inflight.schemas import Settings

    engine = Engine(EngineConfig(model=ensure_default_model(Settings().cache_dir),
                                 num_kv_blocks=256, max_num_seqs=8))
    review = {"type": "object", "additionalProperties": False, "required": ["sentiment", "stars"],
              "properties": {"sentiment": {"enum": ["positive", "negative"]},
                             "stars": {"type": "integer", "minimum": 1, "maximum": 5}}}
    asks = [("Rate this review as JSON: the soup was cold.", {"json": review},
             lambda t: jsonschema.validate(json.loads(t), review)),
            ("What time is the meeting?", {"regex": r"[0-2][0-9]:[0-5][0-9]"},
             lambda t: _check(re.fullmatch(r"[0-2][0-9]:[0-5][0-9]", t))),
            ("Is the sky blue?", {"choice": ["yes", "no"]}, lambda t: _check(t in ("yes", "no"))),
            ("Describe a cat as a JSON object.", {"json_object": True},
             lambda t: _is_dict(json.loads(t)))]
    for i, (_, so, _) in enumerate(asks):
        engine.add_request(str(i), messages=[{"role": "user", "content": asks[i][0]}],
                           params=SamplingParams(max_tokens=64, temperature=0.0, structured_outputs=so))
    finals = {}
    while engine.has_unfinished():
        finals.update((o.request_id, o) for o in engine.step() if o.finished)
    for i, (_, so, check) in enumerate(asks):
        out = finals[str(i)]
        assert out.finish_reason == "stop", (so, out.text)
        check(out.text)


def test_same_outputs_through_every_step_path(tiny_model_path):
    """Greedy and seeded constrained outputs do not depend on how the steps ran: overlapped
    outputs (synchronised around grammars), padded decode steps, chunked prefill, a KV cache
    so small that requests are preempted, and prefix-cache hits."""
    plain = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=512))
    base, _ = _run_suite(plain, max_tokens=40)
    tight = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=24, block_size=4,
                                max_num_batched_tokens=16, overlap_outputs=True,
                                cuda_graphs=True, debug_checks=True))
    fixed = [i for i in range(len(base)) if SAMPLING[i % len(SAMPLING)].get("seed") is not None
             or SAMPLING[i % len(SAMPLING)]["temperature"] == 0.0]  # not the unseeded ones
    for _ in range(2):  # the second round hits the prefix cache
        again, _ = _run_suite(tight, max_tokens=40)
        assert [again[i].text for i in fixed] == [base[i].text for i in fixed]
    assert tight.stats()["preemptions"] > 0 and tight.stats()["prefix_cache_hit_tokens"] > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_with_graphs_and_overlapped_outputs(tiny_model_path):
    """The device path: pinned mask buffers, CUDA-graph decode logits masked, overlap
    synchronised around grammars (CUDA's defaults)."""
    engine = Engine(EngineConfig(model=tiny_model_path, device="cuda", num_kv_blocks=512))
    assert engine.overlap and engine.cuda_graphs
    _, stopped = _run_suite(engine)
    assert stopped == set(range(len(SUITE)))


def test_a_quantized_model(tiny_model_path, tmp_path):
    """The mask acts on the logits, whatever computed them: a w4 model of the tiny one."""
    from tests.quant_models import quantized

    q = quantized(tiny_model_path, tmp_path / "w4", "w4", group_size=32)
    engine = Engine(EngineConfig(model=q, num_kv_blocks=512))
    _, stopped = _run_suite(engine, max_tokens=160, sampling=SAMPLING[:2])
    assert stopped >= {0, 2, 3, 4}


def test_unconstrained_neighbours_are_untouched(tiny_model_path, prompts):
    engine = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=256))
    free = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    alone = engine.generate(prompts[:3], free)
    mixed = engine.generate(prompts[:3] * 2, [free] * 3 + [SamplingParams(
        max_tokens=12, structured_outputs={"regex": "[0-9]+"})] * 3)
    assert [o.token_ids for o in mixed[:3]] == [o.token_ids for o in alone]
    assert all(re.fullmatch("[0-9]+", o.text) for o in mixed[3:])


def test_grammar_end_stops_and_max_tokens_inside_json_is_length(tiny_model_path):
    engine = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=256))
    done, cut = engine.generate(["hello", "hello"], [
        SamplingParams(max_tokens=50, temperature=0.0, structured_outputs={"choice": ["alpha", "beta"]}),
        SamplingParams(max_tokens=3, temperature=0.0, structured_outputs={"json": PERSON})])
    assert done.finish_reason == "stop" and done.text in ("alpha", "beta")
    assert cut.finish_reason == "length" and cut.text == '{"n'


def test_logprobs_are_of_the_masked_distribution(tiny_model_path):
    engine = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=256))
    (out,) = engine.generate(["hello"], SamplingParams(
        max_tokens=20, temperature=0.0, logprobs=5, structured_outputs={"choice": ["yes", "no"]}))
    assert out.text in ("yes", "no")
    allowed = {engine.tokenizer.encode(w, add_special_tokens=False)[0] for w in ("yes", "no")}
    first = out.logprobs[0]
    assert {t for t, _ in first.top} <= allowed | set(engine.eos_token_ids)
    assert all(lp > float("-inf") for _, lp in first.top) and first.rank == 1


def test_a_grammar_that_fails_to_compile_ends_its_request_alone(tiny_model_path):
    engine = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=256))
    bad = StructuredOutputs(regex="[0-9]+")
    object.__setattr__(bad, "regex", "[0-9")  # past the edge's check: the engine's compile fails
    outs = engine.generate(["hello", "hello"], [
        SamplingParams(max_tokens=5, structured_outputs=bad),
        SamplingParams(max_tokens=5, structured_outputs={"regex": "[0-9]+"})])
    assert outs[0].finish_reason == "error" and outs[0].error_code == ERR_INVALID_SCHEMA
    assert "regex" in outs[0].error and "does not compile" in outs[0].error
    assert outs[1].finish_reason in ("stop", "length") and re.fullmatch("[0-9]+", outs[1].text)


def test_a_slow_compile_waits_in_the_queue_and_never_stalls_a_step(tiny_model_path, monkeypatch):
    engine = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=256))
    compiler = engine.grammars.compiler
    slow = compiler._compile

    def compile_slowly(kind, key):
        time.sleep(0.6)
        return slow(kind, key)

    monkeypatch.setattr(compiler, "_compile", compile_slowly)
    engine.add_request("slow", prompt="hello", params=SamplingParams(
        max_tokens=4, structured_outputs={"regex": "[a-z]+"}))
    engine.add_request("free", prompt="hello", params=SamplingParams(max_tokens=8, ignore_eos=True))
    engine.add_request("gone", prompt="hello", params=SamplingParams(
        max_tokens=4, structured_outputs={"regex": "[a-z]+!"}))
    assert engine.abort("gone")
    t0, finished = time.monotonic(), {}
    while engine.has_unfinished():
        s0 = time.monotonic()
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = (out, time.monotonic() - t0)
        assert time.monotonic() - s0 < 0.1  # a step never waits for the compile
    assert finished["gone"][0].finish_reason == "abort"
    assert finished["free"][1] < 0.5 < finished["slow"][1]
    assert re.fullmatch("[a-z]+", finished["slow"][0].text)

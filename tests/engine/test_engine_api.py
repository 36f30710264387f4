"""Engine API: bad requests, abort, stats, text and chat prompts."""

from __future__ import annotations

import pytest

from inflight.schemas import ERR_ENGINE, ERR_INVALID_REQUEST, ERR_PROMPT_TOO_LONG

from inflight.engine import DuplicateRequestError, Engine, EngineConfig, RequestOutput, SamplingParams

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def drain(eng):
    finals = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                assert out.request_id not in finals
                finals[out.request_id] = out
    return finals


@pytest.fixture
def eng(tiny_model_path):
    return Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=32, block_size=4,
                               max_model_len=64, debug_checks=True))


def test_bad_requests_fail_alone(eng, prompts):
    eng.add_request("good", prompt_token_ids=prompts[0], params=GREEDY)
    eng.add_request("empty", prompt_token_ids=[], params=GREEDY)
    eng.add_request("empty-text", prompt="", params=GREEDY)
    eng.add_request("too-long", prompt_token_ids=[5] * 64, params=GREEDY)
    eng.add_request("max-tokens", prompt_token_ids=[5] * 10, params=SamplingParams(max_tokens=60))
    eng.add_request("vocab", prompt_token_ids=[5, 100000], params=GREEDY)
    eng.add_request("stop-vocab", prompt_token_ids=[5, 6],
                    params=SamplingParams(max_tokens=4, stop_token_ids=(3, 100000)))
    small = Engine(EngineConfig(model=eng.config.model, num_kv_blocks=3, block_size=4))
    small.add_request("kv", prompt_token_ids=[5] * 10, params=GREEDY)
    finals = drain(eng)
    assert finals["good"].finish_reason == "length" and len(finals["good"].token_ids) == 8
    for rid, words, code in [("empty", "empty", ERR_INVALID_REQUEST),
                             ("empty-text", "empty", ERR_INVALID_REQUEST),
                             ("too-long", "context", ERR_PROMPT_TOO_LONG),
                             ("max-tokens", "max_tokens", ERR_PROMPT_TOO_LONG),
                             ("vocab", "vocabulary", ERR_INVALID_REQUEST),
                             ("stop-vocab", "stop_token_ids[1]=100000", ERR_INVALID_REQUEST)]:
        assert finals[rid].finish_reason == "error" and words in finals[rid].error, rid
        assert finals[rid].error_code == code, rid
    assert finals["good"].error_code is None
    out = drain(small)["kv"]
    assert out.finish_reason == "error" and "kv_cache_bytes" in out.error
    assert out.error_code == ERR_PROMPT_TOO_LONG


def test_abort_waiting_and_running(eng, prompts):
    eng = Engine(EngineConfig(model=eng.config.model, num_kv_blocks=64, max_num_seqs=1,
                              debug_checks=True))
    eng.add_request("run", prompt_token_ids=prompts[0], params=GREEDY)
    eng.add_request("wait", prompt_token_ids=prompts[1], params=GREEDY)
    eng.step()
    assert eng.stats()["running"] == 1 and eng.stats()["waiting"] == 1
    assert eng.abort("run") and eng.abort("wait") and not eng.abort("nope")
    outs = eng.step()
    assert {o.request_id: o.finish_reason for o in outs} == {"run": "abort", "wait": "abort"}
    assert all(o.finished for o in outs)
    assert not eng.has_unfinished() and eng.stats()["kv_blocks_used"] == 0


def test_duplicate_active_id_raises(eng, prompts):
    eng.add_request("x", prompt_token_ids=prompts[0], params=GREEDY)
    with pytest.raises(DuplicateRequestError):
        eng.add_request("x", prompt_token_ids=prompts[1], params=GREEDY)
    drain(eng)
    eng.add_request("x", prompt_token_ids=prompts[1], params=GREEDY)  # finished: id reusable
    drain(eng)


def test_text_prompt_chat_and_outputs(eng):
    outs = eng.generate(["hello world", "the quick brown fox"], GREEDY)
    assert all(isinstance(o, RequestOutput) and o.finished for o in outs)
    assert outs[0].num_prompt_tokens == len(eng.tokenizer.encode("hello world"))
    assert outs[0].text == eng.tokenizer.decode(outs[0].token_ids)
    assert outs[0].first_token_time >= outs[0].arrival_time and outs[0].finish_time >= outs[0].first_token_time
    chat = eng.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    eng.add_request("chat", messages=[{"role": "user", "content": "hi"}], params=GREEDY)
    assert drain(eng)["chat"].num_prompt_tokens == len(eng.tokenizer.encode(chat, add_special_tokens=False))
    assert eng.max_model_len == 64 and eng.tokenizer.eos_token_id == 1


def test_eos_stops_unless_ignored(eng, prompts):
    # make EOS the greedy choice by declaring the first greedy token to be EOS
    first = eng.generate([prompts[0]], GREEDY)[0].token_ids[0]
    eng.eos_token_ids = frozenset({first})
    out = eng.generate([prompts[0]], SamplingParams(max_tokens=8, temperature=0.0))[0]
    assert out.finish_reason == "stop" and out.token_ids == [first]
    assert eng.generate([prompts[0]], GREEDY)[0].finish_reason == "length"


def test_stats_keys(eng, prompts):
    eng.generate(prompts[:3], GREEDY)
    s = eng.stats()
    for key in ("running", "waiting", "preemptions", "kv_blocks_total", "kv_blocks_used",
                "kv_tokens_stored", "kv_waste", "steps", "prefill_tokens", "decode_tokens",
                "last_step_prefill_tokens", "last_step_decode_tokens", "prefix_cache_queries",
                "prefix_cache_hit_tokens", "prefix_cache_hit_rate", "prefix_cache_blocks",
                "prefix_cache_evictions"):
        assert key in s, key
    assert s["decode_tokens"] == 3 * 7 and s["prefill_tokens"] == sum(map(len, prompts[:3]))


def test_sampling_params_validation():
    from inflight.engine import SamplingParamsError

    for bad in (dict(max_tokens=0), dict(temperature=-1), dict(top_p=0), dict(top_k=-2),
                dict(stop=[""]), dict(seed=-1)):
        with pytest.raises(SamplingParamsError):
            SamplingParams(**bad)
    assert SamplingParams(stop="x").stop == ("x",)


def test_failed_forward_pass_fails_its_requests_not_the_engine(eng, prompts, monkeypatch):
    eng.add_request("a", prompt_token_ids=prompts[0], params=GREEDY)
    eng.add_request("b", prompt_token_ids=prompts[1], params=GREEDY)

    def boom(sched):
        raise RuntimeError("simulated device failure")

    with monkeypatch.context() as m:
        m.setattr(eng.runner, "execute", boom)
        outs = eng.step()
    assert {o.request_id: o.finish_reason for o in outs} == {"a": "error", "b": "error"}
    assert "simulated device failure" in outs[0].error
    assert {o.error_code for o in outs} == {ERR_ENGINE}
    assert not eng.has_unfinished() and eng.stats()["kv_blocks_used"] == 0
    assert eng.generate([prompts[2]], GREEDY)[0].finish_reason == "length"  # still serves

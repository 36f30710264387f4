"""When speculation runs and what it costs the paged cache: drafts count against the step's
budget, big batches and batch-priority requests do not speculate, blocks holding only
rejected drafts go back to the pool, and no unverified token is ever hashed."""

from __future__ import annotations

import pytest

from inflight.engine import SamplingParams
from tests.engine.spec.conftest import GREEDY, drain, make, methods, spec_prompts


def self_draft(path, **over):
    """The target drafting for itself, always k drafts (acceptance 1.0: counts are exact)."""
    return {**methods(path, path)["self-draft"], "draft_token_cost": 0.0, **over}


def test_drafts_count_against_the_token_budget(tiny_model_path):
    eng = make(tiny_model_path, self_draft(tiny_model_path), max_num_batched_tokens=7)
    prompts = spec_prompts(3)
    for i, p in enumerate(prompts):
        eng.add_request(str(i), prompt_token_ids=p[:4], params=GREEDY)
    totals = []
    while eng.has_unfinished():
        sched = eng.scheduler.schedule  # watch each plan the engine makes
        plans = []

        def spy(drafts=None):
            out = sched(drafts)
            plans.append(out)
            return out

        eng.scheduler.schedule = spy
        eng.step()
        eng.scheduler.schedule = sched
        for out in plans:
            totals.append(out.total_tokens)
            for req, d in out.spec_token_ids.items():
                assert out.num_tokens[out.requests.index(req)] == 1 + len(d)
    assert max(totals) == 7 and all(t <= 7 for t in totals)
    assert eng.stats()["spec_decode_num_drafts"] > 0


def test_batch_size_and_priority_switch_speculation_off(tiny_model_path):
    prompts = spec_prompts(4)
    # a running batch of 4 > disable_by_batch_size 2: no step speculates until two finish
    eng = make(tiny_model_path, self_draft(tiny_model_path, disable_by_batch_size=2))
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in (4, 4, 24, 24)]
    outs = eng.generate(prompts, params)
    s = eng.stats()
    assert s["spec_decode_num_drafts"] > 0 and all(len(o.token_ids) == len(o.token_ids) for o in outs)
    assert s["spec_decode_num_drafts"] <= 2 * 24 // 5 + 2     # only the two long ones, at the end
    # batch priority: off by default, on when the request asks
    eng = make(tiny_model_path, self_draft(tiny_model_path))
    eng.add_request("batch", prompt_token_ids=prompts[0], params=GREEDY, priority=10)
    drain(eng)
    assert eng.stats()["spec_decode_num_drafts"] == 0
    forced = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, speculative=True)
    eng.add_request("forced", prompt_token_ids=prompts[0], params=forced, priority=10)
    eng.add_request("off", prompt_token_ids=prompts[1],
                    params=SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, speculative=False))
    drain(eng)
    assert 0 < eng.stats()["spec_decode_num_drafts"] <= 24 // 5 + 1   # "forced" alone


def test_rejected_drafts_blocks_are_freed_and_never_hashed(tiny_model_path, draft_model_path):
    """After every verification a request holds no block beyond its computed tokens and its
    registered (hashed) blocks hold only tokens it has: no unverified draft is hashed."""
    spec = methods(tiny_model_path, draft_model_path)["draft"]
    eng = make(tiny_model_path, spec, block_size=2)
    for i, p in enumerate(spec_prompts(4)):
        eng.add_request(str(i), prompt_token_ids=p, params=GREEDY)
    rejected = 0
    while eng.has_unfinished():
        before = eng.stats()
        eng.step()
        after = eng.stats()
        rejected += (after["spec_decode_num_draft_tokens"] - before["spec_decode_num_draft_tokens"]) - \
            (after["spec_decode_num_accepted_tokens"] - before["spec_decode_num_accepted_tokens"])
        for req in eng.scheduler.running:
            assert len(req.block_ids) == eng.kv.blocks_for(req.num_computed_tokens), req.request_id
            assert eng.kv.num_registered_blocks(req) * eng.block_size <= req.num_tokens
            for i in range(eng.kv.num_registered_blocks(req)):
                block = eng.kv.blocks_of(req)[i]
                tokens = req.all_token_ids[i * eng.block_size:(i + 1) * eng.block_size]
                assert block.block_hash == req.block_hashes[i] and len(tokens) == eng.block_size
    assert rejected > 0


def test_seeded_sampling_with_speculation_is_reproducible(tiny_model_path, draft_model_path):
    """The same seeds give the same tokens, whatever else is in the batch."""
    spec = methods(tiny_model_path, draft_model_path)["draft"]
    prompts = spec_prompts(3)
    params = [SamplingParams(max_tokens=16, temperature=0.8, top_k=40, top_p=0.95, seed=5 + i,
                             ignore_eos=True) for i in range(3)]
    a = make(tiny_model_path, spec).generate(prompts, params)
    b = make(tiny_model_path, spec).generate(prompts[:1], params[:1])
    c = make(tiny_model_path, spec).generate(prompts, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in c]
    assert a[0].token_ids == b[0].token_ids
    assert all(len(o.token_ids) == 16 for o in a)


def test_constrained_requests_do_not_speculate_beside_ones_that_do(tiny_model_path):
    """A regex-constrained request (masked on its one logit row) shares verification steps
    with a speculating one: its output matches the regex and is the same as without
    speculation; the other's tokens are the plain ones."""
    import re

    regex = r"[a-z]{3,12}"
    constrained = SamplingParams(max_tokens=12, temperature=0.0, structured_outputs={"regex": regex})
    prompts = spec_prompts(2)
    want = make(tiny_model_path).generate(prompts, [constrained, GREEDY])
    eng = make(tiny_model_path, self_draft(tiny_model_path))
    got = eng.generate(prompts, [constrained, GREEDY])
    assert re.fullmatch(regex, got[0].text) and got[0].token_ids == want[0].token_ids
    assert got[1].token_ids == want[1].token_ids
    s = eng.stats()
    assert s["spec_decode_num_drafts"] > 0 and s["grammar_masks"] > 0


@pytest.mark.parametrize("method", ["ngram", "suffix", "self-draft"])
def test_constrained_greedy_outputs_identical_and_valid_with_speculation(tiny_model_path, method):
    """Every kind of constraint (JSON schema, json_object, regex, choice, GBNF, Lark), greedy,
    beside unconstrained requests that speculate and then alone: the same tokens as without
    speculation, every stopped output valid, and a constrained request is never given drafts
    (engine/spec/decoder.py: it decodes plainly, masked on its one logit row)."""
    from tests.engine.test_structured import SUITE

    spec = {**methods(tiny_model_path, tiny_model_path)[method], "draft_token_cost": 0.0}
    constrained = [SamplingParams(max_tokens=40, temperature=0.0, structured_outputs=so) for so, _ in SUITE]
    prompts = spec_prompts(2 * len(SUITE))
    params = constrained + [GREEDY] * len(SUITE)
    want = make(tiny_model_path).generate(prompts, params)
    eng = make(tiny_model_path, spec)
    got = eng.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert eng.stats()["spec_decode_num_drafts"] > 0 and eng.stats()["grammar_masks"] > 0
    stopped = 0
    for out, (_, check) in zip(got, SUITE):
        assert out.finish_reason in ("stop", "length"), (out.finish_reason, out.error)
        if out.finish_reason == "stop":
            check(out.text)
            stopped += 1
    assert stopped >= len(SUITE) // 2
    alone = make(tiny_model_path, spec)
    got = alone.generate(prompts[:len(SUITE)], constrained)
    assert [o.token_ids for o in got] == [o.token_ids for o in want[:len(SUITE)]]
    assert alone.stats()["spec_decode_num_drafts"] == 0

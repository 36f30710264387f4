"""The GPU step's code paths, run on CPU: padded static decode buffers ("CUDA graphs" on CPU
run their body eagerly, with the block table and step inputs kept in separate device
buffers updated by diffs, as on CUDA) and output processing overlapped with the next step
(one step ahead). Both must give exactly the outputs of the plain path, over mixed
prefill/decode steps, chunked prefill, preemption, aborts, stop strings, stop tokens and
seeded sampling; greedy tokens equal Hugging Face's."""

from __future__ import annotations

import pytest

from inflight.engine import Engine, EngineConfig, SamplingParams

N = 12
MODES = {
    "plain": dict(),
    "graphs": dict(cuda_graphs=True),
    "overlap": dict(overlap_outputs=True),
    "graphs+overlap": dict(cuda_graphs=True, overlap_outputs=True),
}


def make(path, mode, **kw):
    cfg = dict(num_kv_blocks=24, block_size=4, max_num_batched_tokens=24, max_num_seqs=6,
               debug_checks=True)
    cfg.update(kw)
    return Engine(EngineConfig(model=path, **cfg, **MODES[mode]))


def drive(eng, work, abort_after=None):
    """Run `work` [(rid, prompt, params)]: half up front, the rest one per 3 outputs seen
    (arrivals react to outputs, not to step calls, so the overlapped mode sees the same
    arrivals); `abort_after` {rid: n} aborts rid once it has streamed n tokens.
    Returns (events in order, {rid: final output})."""
    abort_after = dict(abort_after or {})
    todo = list(work)
    for _ in range(len(todo) // 2):
        rid, prompt, params = todo.pop(0)
        eng.add_request(rid, prompt_token_ids=prompt, params=params)
    events, finals, streamed, seen = [], {}, {}, 0
    while todo or eng.has_unfinished():
        outs = eng.step()
        # rows follow the running requests through admit/finish/preempt/resume/abort
        assert set(eng.runner.batch.row_of) == set(eng.scheduler.running)
        for out in outs:
            events.append((out.request_id, tuple(out.new_token_ids), out.text_delta, out.finished,
                           out.finish_reason))
            streamed.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                assert out.request_id not in finals
                finals[out.request_id] = out
            seen += 1
            if todo and seen % 3 == 0:
                rid, prompt, params = todo.pop(0)
                eng.add_request(rid, prompt_token_ids=prompt, params=params)
        for rid, n in list(abort_after.items()):
            if len(streamed.get(rid, ())) >= n:
                assert eng.abort(rid)
                del abort_after[rid]
        if not outs and not eng.has_unfinished() and todo:
            rid, prompt, params = todo.pop(0)
            eng.add_request(rid, prompt_token_ids=prompt, params=params)
    for rid, out in finals.items():
        assert streamed[rid] == out.token_ids, rid  # deltas add up to the final
    assert eng.stats()["kv_blocks_used"] == 0 and not eng.runner.batch.row_of
    return events, finals


@pytest.fixture(scope="module")
def workload(tiny_model_path, prompts):
    """Greedy requests (some with stop tokens / stop strings picked from a first plain
    run so they really stop), two seeded sampled requests, one ignored-EOS pair."""
    greedy = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)
    first = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=256)).generate(prompts, greedy)
    work = []
    for i, (p, out) in enumerate(zip(prompts, first)):
        if i % 4 == 1:
            params = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True,
                                    stop_token_ids=(out.token_ids[5],))
        elif i % 4 == 2 and len(out.text) > 6:
            params = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True,
                                    stop=(out.text[3:6],))
        elif i % 4 == 3:
            params = SamplingParams(max_tokens=N, temperature=0.9, top_k=20, top_p=0.9,
                                    seed=100 + i, ignore_eos=True)
        else:
            params = greedy
        work.append((f"r{i}", p, params))
    return work


@pytest.fixture(scope="module")
def reference(tiny_model_path, workload):
    return drive(make(tiny_model_path, "plain"), workload, {"r4": 3, "r8": 5})


@pytest.mark.parametrize("mode", ["graphs", "overlap", "graphs+overlap"])
def test_same_outputs_as_plain_path(tiny_model_path, workload, reference, hf_ref, mode):
    eng = make(tiny_model_path, mode)
    events, finals = drive(eng, workload, {"r4": 3, "r8": 5})
    ref_events, ref_finals = reference
    assert set(finals) == set(ref_finals)
    for rid, ref in ref_finals.items():
        out = finals[rid]
        assert (out.token_ids, out.text, out.finish_reason) == \
            (ref.token_ids, ref.text, ref.finish_reason), rid
    if "overlap" not in mode:  # same step boundaries: the very same stream of outputs
        assert events == ref_events
    reasons = {o.finish_reason for o in finals.values()}
    assert reasons == {"length", "stop", "abort"}
    assert eng.stats()["preemptions"] > 0
    if "graphs" in mode:
        assert eng.runner.graphs.num_eager > 0  # the padded path ran (eagerly: CPU)
        assert not eng.runner.batch.shared      # block table on the "device" by diffs
    if "overlap" in mode:
        assert eng.runner.num_device_fed > 0    # pending tokens fed from the device
    # greedy, unstopped, unaborted requests: HF's tokens
    for rid, prompt, params in workload:
        out = finals[rid]
        if params.temperature == 0 and out.finish_reason == "length":
            assert out.token_ids == hf_ref.greedy(tiny_model_path, prompt, N), rid


def test_overlapped_step_returns_previous_steps_outputs(tiny_model_path, prompts):
    eng = make(tiny_model_path, "overlap", num_kv_blocks=64)
    eng.add_request("a", prompt_token_ids=prompts[0],
                    params=SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    assert eng.step() == []             # step 1 launched, nothing processed yet
    assert eng.requests["a"].num_pending == 1
    first = eng.step()                  # step 2 launched with step 1's token from the device
    assert [o.new_token_ids for o in first] and not first[0].finished
    outs = [first] + [eng.step() for _ in range(2)]
    assert outs[-1][0].finished and outs[-1][0].finish_reason == "length"
    assert not eng.has_unfinished()


def test_padded_sizes_and_padding_rows(tiny_model_path, prompts):
    from inflight.engine.cuda_graphs import graph_sizes

    assert graph_sizes(64) == [1, 2, 4, 8] + list(range(16, 64, 8)) + [64]
    assert graph_sizes(6) == [1, 2, 4, 6] and graph_sizes(1) == [1]
    eng = make(tiny_model_path, "graphs", max_num_seqs=8, num_kv_blocks=128)
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outs = eng.generate(prompts[:3], greedy)  # 3 decodes run padded to 4
    plain = make(tiny_model_path, "plain", max_num_seqs=8, num_kv_blocks=128).generate(prompts[:3], greedy)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    g = eng.runner.graphs
    assert g.num_eager > 0 and g.padded_size(3) == 4 and g.padded_size(9) is None

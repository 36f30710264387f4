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


# -- the order and timing the GPU step relies on (engine/model_runner.py NOTE) -----------------
def test_launch_result_order_is_enforced(tiny_model_path):
    """Step k's sampled ids sit in pinned buffer k % 2: at most one launched step may be
    unread at a launch, and results come in launch order, once."""
    from inflight.engine.model_runner import StepOrderError
    from inflight.engine.profile_run import profile_batch

    eng = make(tiny_model_path, "graphs+overlap", num_kv_blocks=64)
    runner = eng.runner
    s1, _ = profile_batch([5, 1], 4)
    s2, _ = profile_batch([3], 4)
    s3, _ = profile_batch([2], 4)
    h1 = runner.launch(s1)
    h2 = runner.launch(s2)          # one unread (h1): allowed, as in the overlapped engine
    with pytest.raises(StepOrderError, match="unread"):
        runner.launch(s3)            # two unread: its ids would go where h1's still are
    with pytest.raises(StepOrderError, match="out of order"):
        runner.result(h2)
    assert len(runner.result(h1)) == 2 and len(runner.result(h2)) == 1
    with pytest.raises(StepOrderError, match="out of order"):
        runner.result(h1)            # read twice
    assert len(runner.result(runner.launch(s3))) == 1
    for req in s1.requests + s2.requests + s3.requests:
        runner.remove(req)
    # the engine goes on as before
    out = eng.generate([[5, 6, 7, 8, 9]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    assert len(out[0].token_ids) == 4


def _registered(eng, req) -> int:
    """How many of req's leading full blocks a lookup finds in the prefix cache."""
    eng.kv._update_hashes(req)
    n = 0
    for h in req.block_hashes:
        if eng.kv.pool.lookup(h) is None:
            break
        n += 1
    return n


def test_prefix_blocks_registered_once_their_step_completed(tiny_model_path, prompts):
    """Overlapped: a step's full blocks become findable when its result is read (the step
    after it has been launched by then), not at its own launch."""
    eng = make(tiny_model_path, "overlap", num_kv_blocks=64)
    prompt = prompts[7][:13]  # 3 full blocks of 4
    eng.add_request("a", prompt_token_ids=prompt,
                    params=SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    req = eng.requests["a"]
    assert eng.step() == []                      # step 1 (the prefill) launched, not read
    assert req.num_computed_tokens == 13 and _registered(eng, req) == 0
    eng.step()                                   # step 2 launched, step 1 read
    assert req.num_computed_tokens == 14 and _registered(eng, req) == 3
    while eng.has_unfinished():
        eng.step()


def test_blocks_of_a_failed_step_never_enter_the_prefix_cache(tiny_model_path, prompts, hf_ref):
    """A step whose result fails registers nothing: a later request with the same prompt
    computes it again instead of hitting blocks that may hold garbage."""
    eng = make(tiny_model_path, "overlap", num_kv_blocks=64)
    prompt = prompts[7][:13]
    runner = eng.runner
    result = runner.result

    def failing(handle):
        result(handle)  # keep the launch/result order; then fail as a device error would
        raise RuntimeError("device error")

    runner.result = failing
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    eng.add_request("a", prompt_token_ids=prompt, params=greedy)
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    assert [(o.finish_reason, o.error_code) for o in outs if o.finished] == [("error", "engine_error")]
    runner.result = result
    out = eng.generate([prompt], greedy)[0]
    assert out.num_cached_tokens == 0 and eng.stats()["prefix_cache_hit_tokens"] == 0
    assert out.token_ids == hf_ref.greedy(tiny_model_path, prompt, 4)


@pytest.mark.parametrize("mode", ["plain", "graphs+overlap"])
def test_no_host_list_becomes_a_device_tensor_in_a_launch(tiny_model_path, prompts, monkeypatch, mode):
    """A launch copies host data to the device once, staged (pinned on CUDA); a tensor built
    from a Python list there would be a synchronous pageable copy. Checked with prompt
    logprobs, logprobs and seeded sampling, whose indices used to be built that way."""
    import sys

    import torch

    eng = make(tiny_model_path, mode, num_kv_blocks=64)
    made: list[str] = []
    real_tensor, real_as_tensor = torch.tensor, torch.as_tensor
    in_launch = [False]

    def spy(real):
        def wrapped(*a, **kw):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if in_launch[0] and caller.startswith("inflight.engine"):
                made.append(caller)
            return real(*a, **kw)
        return wrapped

    launch = eng.runner.launch

    def watched(*a, **kw):
        in_launch[0] = True
        try:
            return launch(*a, **kw)
        finally:
            in_launch[0] = False

    monkeypatch.setattr(torch, "tensor", spy(real_tensor))
    monkeypatch.setattr(torch, "as_tensor", spy(real_as_tensor))
    eng.runner.launch = watched
    params = [SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=3, prompt_logprobs=2),
              SamplingParams(max_tokens=5, temperature=0.9, top_k=20, top_p=0.9, seed=7, ignore_eos=True,
                             logprobs=1),
              SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)]
    outs = eng.generate(prompts[:3], params)
    assert [len(o.token_ids) for o in outs] == [5, 5, 5]
    assert len(outs[0].prompt_logprobs) == len(prompts[0]) and len(outs[1].logprobs) == 5
    assert made == []

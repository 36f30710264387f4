"""A rank that dies stops the leader's engine (it cannot hang or answer garbage); the TP
code path at size 1; sizes refused before any rank starts. (kill -9 of the leader, mid-run:
tests/consumers/test_tensor_parallel_service.py, on a real worker.)"""

from __future__ import annotations

import signal

import pytest

from inflight.engine import Engine, EngineConfig, SamplingParams
from inflight.engine.errors import EngineDeadError


def test_a_dead_rank_stops_the_engine(tp_models):
    eng = Engine(EngineConfig(model=str(tp_models["llama"]), num_kv_blocks=64, tensor_parallel_size=2))
    try:
        params = SamplingParams(max_tokens=4, ignore_eos=True)
        assert len(eng.generate([[5, 6, 7]], params)[0].token_ids) == 4
        follower = eng.parallel.followers[0]
        follower.send_signal(signal.SIGKILL)
        follower.wait(10)
        eng.add_request("after", prompt_token_ids=[5, 6, 7], params=params)
        with pytest.raises(EngineDeadError, match="rank 1"):
            for _ in range(10):
                eng.step()
    finally:
        eng.close()
    assert eng.parallel is None


def test_the_tp_code_path_at_size_1_starts_nothing(tp_models):
    """distributed_executor_backend="mp" at size 1: the sharded model over one rank (what
    benchmarks/tensor_parallel.py times against the plain path), the same tokens."""
    path = str(tp_models["llama"])
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    plain = Engine(EngineConfig(model=path, num_kv_blocks=64))
    mp = Engine(EngineConfig(model=path, num_kv_blocks=64, distributed_executor_backend="mp"))
    assert plain.parallel is None and mp.parallel.followers == [] and mp.parallel.world == 1
    assert type(mp.model).__name__ == "LeaderModel"
    assert [o.token_ids for o in mp.generate(prompts, params)] == \
        [o.token_ids for o in plain.generate(prompts, params)]
    mp.close()


def test_bad_sizes_are_refused_before_any_rank_starts(tp_models):
    from inflight.engine.errors import ConfigError

    with pytest.raises(ConfigError, match="tensor_parallel_size=4 does not divide num_attention_heads=6"):
        Engine(EngineConfig(model=str(tp_models["llama"]), num_kv_blocks=64, tensor_parallel_size=4,
                            distributed_executor_backend="mp"))
    with pytest.raises(ConfigError, match="needs distributed_executor_backend 'mp'"):
        EngineConfig(model="x", tensor_parallel_size=2, distributed_executor_backend="uni")

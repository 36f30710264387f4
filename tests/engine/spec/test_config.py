"""speculative_config takes vLLM's keys (dict, JSON text) and refuses what it cannot run."""

from __future__ import annotations

import pytest

from inflight.engine import EngineConfig
from inflight.engine.errors import ConfigError
from inflight.engine.spec.config import DEFAULT_BATCH_PRIORITY, SpeculativeConfig
from tests.tiny_llama import write_tiny_llama
from tests.engine.spec.conftest import make


def test_vllm_keys_as_dict_and_json():
    cfg = EngineConfig(model="m", speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                                      "prompt_lookup_min": 2, "prompt_lookup_max": 4})
    spec = cfg.speculative_config
    assert isinstance(spec, SpeculativeConfig) and (spec.method, spec.num_speculative_tokens) == ("ngram", 4)
    assert EngineConfig(model="m", speculative_config=spec.to_dict()).speculative_config == spec
    text = '{"model": "/d", "num_speculative_tokens": 3}'  # a model without a method: a draft model
    assert SpeculativeConfig.from_value(text).method == "draft_model"
    suffix = SpeculativeConfig.from_value({"method": "suffix"})
    assert suffix.num_speculative_tokens == suffix.suffix_decoding_max_tree_depth == 24


def test_the_wire_and_the_engine_agree_on_the_batch_priority():
    from inflight.schemas.requests import PRIORITY_BATCH

    assert DEFAULT_BATCH_PRIORITY == PRIORITY_BATCH


@pytest.mark.parametrize("value, match", [
    ({"method": "eagle", "num_speculative_tokens": 2}, "method='eagle' is not supported"),
    ({"method": "ngram"}, "needs \"num_speculative_tokens\""),
    ({"method": "ngram", "num_speculative_tokens": 2, "speculative_token_tree": "[]"},
     "speculative_token_tree are not supported"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "needs \"model\""),
    ({"method": "ngram", "num_speculative_tokens": 0}, r"must be an integer in \[1, 64\]"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5}, "1 <= min <= max"),
    ("{not json", "not valid JSON"),
])
def test_bad_values_are_refused_by_name(value, match):
    with pytest.raises(ConfigError, match=match):
        EngineConfig(model="m", speculative_config=value)


def test_a_draft_model_with_another_tokenizer_is_refused(tiny_model_path, tmp_path):
    other = write_tiny_llama(tmp_path / "other", vocab_size=400)
    with pytest.raises(ConfigError, match="different tokenizer"):
        make(tiny_model_path, {"method": "draft_model", "model": str(other), "num_speculative_tokens": 2})


def test_tensor_parallel_speculation_is_refused():
    with pytest.raises(ConfigError, match="tensor_parallel_size=2 is not supported yet"):
        EngineConfig(model="m", tensor_parallel_size=2,
                     speculative_config={"method": "ngram", "num_speculative_tokens": 2})

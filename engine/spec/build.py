"""Build the speculative decoder an EngineConfig asks for (None when it asks for none)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inflight.engine.spec.adaptive import linear_costs
from inflight.engine.spec.decoder import SpecDecoder
from inflight.engine.spec.verify_costs import calibrated_costs, default_costs, model_identity

if TYPE_CHECKING:
    from inflight.engine.config import EngineConfig
    from inflight.engine.kv_cache_manager import KVCacheManager
    from inflight.engine.model_runner import ModelRunner


def build_spec_decoder(config: EngineConfig, runner: ModelRunner,
                       kv: KVCacheManager) -> SpecDecoder | None:
    """For an engine under construction: its runner (KV cache allocated) and KV manager."""
    spec = config.speculative_config
    if spec is None:
        return None
    if spec.method == "ngram":
        from inflight.engine.spec.ngram import NgramProposer

        proposer = NgramProposer(spec.num_speculative_tokens, spec.prompt_lookup_min,
                                 spec.prompt_lookup_max)
    elif spec.method == "suffix":
        from inflight.engine.spec.suffix import SuffixProposer

        proposer = SuffixProposer(spec)
    else:
        from inflight.engine.spec.draft import DraftProposer

        proposer = DraftProposer(spec, runner, kv)
        runner.drafter = proposer  # a verification reads its proposal's q
    k = spec.num_speculative_tokens
    if spec.draft_token_cost is not None:
        costs = linear_costs(k, spec.draft_token_cost)
    elif config.cache_dir is None:
        costs = default_costs(runner.device.type, k)
    else:
        costs = calibrated_costs(runner, k, kv.num_blocks, model_id=model_identity(config.model),
                                 cache_dir=config.cache_dir)
    return SpecDecoder(spec, proposer, costs)

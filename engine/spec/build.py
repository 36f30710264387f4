"""Build the speculative decoder an EngineConfig asks for (None when it asks for none)."""

from __future__ import annotations

from inflight.engine.spec.decoder import SpecDecoder


def build_spec_decoder(config, engine) -> SpecDecoder | None:
    """`engine`: the Engine under construction (its model, runner, KV manager, tokenizer)."""
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

        proposer = DraftProposer.for_engine(spec, engine)
        engine.runner.drafter = proposer  # a verification reads its proposal's q
    return SpecDecoder(spec, proposer, engine.device.type)

"""Speculative decoding: propose k tokens cheaply, verify them in the target's own forward.

    config.py     SpeculativeConfig (vLLM's speculative_config keys)
    decoder.py    who speculates in a step, how many drafts; the counters (stats.py)
    ngram.py      prompt lookup in the request's own context
    suffix.py     the request's context plus a bounded cache of recent outputs
    draft.py      a smaller model sharing the tokenizer, its KV in the same block tables
    layout.py     the rows of a verification step
    rejection.py  greedy acceptance and rejection sampling, on the device

One step: the proposer drafts for the decoding requests; the scheduler gives each
1 + len(drafts) tokens (drafts count against the budget); the runner verifies all of them
in the one forward of the step; the engine appends the emitted tokens (stop checks token by
token), rolls `num_computed_tokens` back past the rejected drafts and frees blocks that
hold only rejected tokens. The KV written for rejected drafts is never read: attention
reads positions below a request's computed count, and the next step overwrites them.
"""

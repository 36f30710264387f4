"""Speculative decoding counters, as vLLM counts them.

    num_drafts           verifications that checked at least one draft
    num_draft_tokens     drafts checked
    num_accepted_tokens  drafts accepted
    accepted_per_pos[j]  verifications whose draft j (0-based) was accepted

acceptance rate = accepted / draft tokens; mean accepted length = 1 + accepted / drafts
(tokens out of one verification, the target's own next token included).
"""

from __future__ import annotations


class SpecStats:
    def __init__(self, k: int):
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * k

    def record(self, num_drafts: int, num_accepted: int) -> None:
        if not num_drafts:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        per_pos = self.accepted_per_pos
        for j in range(num_accepted):
            per_pos[j] += 1

    def snapshot(self) -> dict:
        drafts, tokens, accepted = self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens
        return {
            "spec_decode_num_drafts": drafts,
            "spec_decode_num_draft_tokens": tokens,
            "spec_decode_num_accepted_tokens": accepted,
            "spec_decode_accepted_per_pos": list(self.accepted_per_pos),
            "spec_decode_acceptance_rate": accepted / tokens if tokens else 0.0,
            "spec_decode_mean_accepted_length": 1.0 + accepted / drafts if drafts else 0.0,
        }

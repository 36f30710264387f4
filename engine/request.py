"""One request's state as it flows through the engine."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from inflight.engine.detokenizer import IncrementalDetokenizer
from inflight.engine.logprobs import TokenLogprob
from inflight.engine.sampling_params import SamplingParams

if TYPE_CHECKING:  # the grammar engine loads with the first constrained request only
    from inflight.engine.fair_share import TenantShare
    from inflight.engine.grammar import GrammarMatcher

_NO_DEADLINE = float("inf")


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


FINISH_REASONS = ("stop", "length", "abort", "error", "expired")


@dataclass(eq=False)
class Request:
    """Tokens, block table and progress of one request (what scheduling and the step need;
    the blocks themselves are the KVCacheManager's, per-feature state its owner's).

    NOTE: scheduling is "computed tokens catch up": `num_computed_tokens` counts the
    leading tokens of `all_token_ids` whose K/V sit in the cache. A prefill chunk, a
    decode step and a prefix-cache hit all just move it forward; preemption resets it.

        all_token_ids:  [ prompt ............ | output ...... ]
                          ^ computed ....... ^ num_computed_tokens   ^ num_tokens
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    arrival_time: float = field(default_factory=time.time)
    arrival_index: int = 0
    extra_keys: tuple = ()  # anything besides tokens that changes the KV (adapter ids)
    lora: str | None = None  # the LoRA adapter it runs with (engine/lora), None: the base model
    tenant: str | None = None  # who it is for (fair share between tenants)
    deadline: float | None = None  # epoch seconds: expired (not started: never run) after it

    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1  # prompt tokens served by the prefix cache (set on admission)
    # the block table (its blocks are the KVCacheManager's) and the hashes of the full
    # blocks of all_token_ids (engine/block_pool.py)
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    num_preemptions: int = 0
    finish_reason: str | None = None
    error: str | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    generator: torch.Generator | None = None
    detok: IncrementalDetokenizer | None = None
    # Tokens sampled on the device but not yet seen by the host (0 or 1): with output
    # processing overlapped (one step ahead), step N+1 is scheduled before step N's
    # token is known, and that token is its input.
    num_pending: int = 0
    # prompt + max_tokens, capped by the model context (set by the engine): the token at
    # position max_num_tokens - 1 ends the request, so its K/V is never computed.
    max_num_tokens: int = 1 << 62
    # asked for by params.logprobs / prompt_logprobs (engine/logprobs.py); the prompt's list
    # starts with None (the first token has no context) and grows chunk by chunk
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # params.structured_outputs: the request's position in its grammar, from admission
    # (its compile is the GrammarQueue's until then)
    grammar: GrammarMatcher | None = None
    # params.bad_words as the token ids they ban (set by the engine; engine/logits_processors.py)
    banned_token_ids: tuple[int, ...] = ()
    # the slot of its adapter while it runs (engine/lora/manager.py), else -1
    lora_slot: int = -1
    # its tenant's counter (engine/fair_share.py; set when the scheduler queues it)
    share: TenantShare | None = None

    def __post_init__(self) -> None:
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        if self.params.logprobs is not None:
            self.logprobs = []
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs = [None]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens_to_compute(self) -> int:
        """Tokens whose K/V the next step may compute: all known ones, plus a pending one
        unless it is certain to end the request (by length)."""
        n = len(self.all_token_ids) - self.num_computed_tokens
        if self.num_pending:
            n = min(n + self.num_pending, self.max_num_tokens - 1 - self.num_computed_tokens)
        return n

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Asked for prompt logprobs and some are still to compute (then the prompt is
        computed, not taken from the prefix cache: cached positions have no logits)."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def sort_key(self) -> tuple[int, int]:
        """Lower priority value first, then earlier arrival (vLLM convention)."""
        return (self.priority, self.arrival_index)

    @property
    def queue_key(self) -> tuple[float, int]:
        """Order within its (class, tenant) queue: earlier deadline, then earlier arrival."""
        return (_NO_DEADLINE if self.deadline is None else self.deadline, self.arrival_index)

    @property
    def started(self) -> bool:
        """Admitted to a step at least once (its cached prefix is known from then on)."""
        return self.num_cached_tokens >= 0

"""A launched step on the device: its inputs (views into the staged copy), its outputs,
and the handle the engine reads its sampled ids through (engine/model_runner.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

import torch

from inflight.engine.logprobs import LogprobRows, StepLogprobs
from inflight.engine.request import Request
from inflight.engine.sampler import SamplingBatch

if TYPE_CHECKING:
    from inflight.engine.grammar import GrammarMatcher
    from inflight.engine.lora.slots import LoraStep


@dataclass
class StepHandle:
    """A launched step: who samples, and where its sampled ids will be."""

    requests: list[Request]       # scheduled, in schedule order
    samplers: list[Request]       # those that sample, in schedule order
    sample_pos: list[int] | None  # their positions among `requests` (None: all sample)
    sampled: torch.Tensor         # [n] device
    seq: int                      # launch number (the launch/result order)
    seq_lens: list[int]           # each request's computed tokens once this step is done
    host_out: torch.Tensor | None = None  # pinned [n] (CUDA)
    event: torch.cuda.Event | None = None
    logprobs: StepLogprobs | None = None  # when a request asked for logprobs (resolved by result)
    emitted: torch.Tensor | None = None  # [n, K+1] a verification step's tokens (-1 padded)
    constrained: bool = False     # some sampler's tokens were masked by its grammar


@dataclass(slots=True)
class SpecInputs:
    """A verification step's device inputs (engine/spec/layout.py, rejection.py)."""

    vidx: torch.Tensor                # [n, K+1] logit row of each request's j-th position
    drafts: torch.Tensor              # [n, K] (-1 = none)
    num_drafts: list[int]             # per request
    draft_probs: torch.Tensor | None  # [n, K, V] a draft model's q, or None (point masses)


@dataclass(slots=True)
class DeviceStep:
    """A launched step's inputs on the device: views into its one staged copy."""

    n: int                            # scheduled requests
    T: int                            # tokens
    padded: int | None                # P: a padded decode step on the static buffers
    sampling: SamplingBatch
    masked: list[tuple[int, GrammarMatcher]]  # (logits row, matcher) of constrained samplers
    # an eager step's flattened batch (layout in the module docstring)
    rows: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    ids: torch.Tensor | None = None
    src: torch.Tensor | None = None   # None: no token is fed from the last step's samples
    qsl: torch.Tensor | None = None
    width: int = 0                    # block-table columns to gather
    logit_rows: torch.Tensor | None = None  # a verification's rows (default: each last token)
    spec: SpecInputs | None = None
    # logprobs: sampler logit rows; prompt-scoring token rows and their targets; the most
    # alternatives any of them asked for
    logprob_rows: torch.Tensor | None = None
    prompt_rows: torch.Tensor | None = None
    prompt_targets: torch.Tensor | None = None
    logprob_top_n: int = 0
    prompt_top_n: int = 0
    # logits processors (engine/logits_processors.py): each logits row's batch row, and
    # the sampler rows among them (None: every row samples); None when no row uses one
    proc_rows: torch.Tensor | None = None
    proc_samplers: torch.Tensor | None = None
    lora: LoraStep | None = None      # which tokens use which adapter slot (engine/lora/slots.py)


@dataclass(slots=True)
class DeviceOutput:
    sampled: torch.Tensor             # [n] ids, or [n, K+1] emitted ids of a verification
    sample_logprobs: LogprobRows | None = None  # of the logprob_rows' sampled tokens
    prompt_logprobs: LogprobRows | None = None  # of the prompt tokens the prompt rows score


class DraftProbs(Protocol):
    """A draft model's q of its last proposal (engine/spec/draft.py)."""

    def prob_rows(self, requests: Sequence[Request],
                  spec_token_ids: dict[Request, list[int]]) -> list[int] | None: ...

    def draft_probs(self, rows: torch.Tensor, K: int) -> torch.Tensor: ...


class StepOrderError(RuntimeError):
    """A step was launched or read out of the order the pinned double buffers rely on."""

"""A step's host inputs: one pass over the scheduled requests, before anything is packed.

For n scheduled requests (schedule order) with T tokens in all:

    rows, seq_lens        [n]  the request's InputBatch row; computed tokens after the step
    ids                   [T]  request 0's new tokens | request 1's | ...
    src_at / src_idx           token rows fed on the device from the last step's sampled
                               ids (overlap), and where in those ids
    samplers, sample_pos       the requests that sample, and their positions among the n
    masked                     (position, matcher) of samplers with a grammar
    lp_reqs / lp_pos           samplers that asked for logprobs, and their positions
    prompt_rows / _at / _targets  prompt-logprob spans (request, start, stop), their token
                               rows in the step, and the prompt token each row scores
    spec                       a verification step's rows (engine/spec/layout.py), or None

A request samples when this step brings its computed tokens up to all its tokens (the end
of a prefill, or a decode); a mid-prompt prefill chunk's sample is ignored.

NOTE: features that no request in the batch uses cost nothing here: the loop asks a
request about grammars and logprobs only while the batch holds some that use them
(`InputBatch.num_featured`), and the prompt-logprob spans are built by their own function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from inflight.engine.input_batch import InputBatch
from inflight.engine.request import Request
from inflight.engine.spec.layout import SpecLayout

if TYPE_CHECKING:
    from inflight.engine.grammar import GrammarMatcher
    from inflight.engine.scheduler import SchedulerOutput


@dataclass(slots=True)
class StepInputs:
    requests: Sequence[Request]
    num_tokens: Sequence[int]
    rows: list[int] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    src_at: list[int] = field(default_factory=list)
    src_idx: list[int] = field(default_factory=list)
    samplers: list[Request] = field(default_factory=list)
    sample_pos: list[int] = field(default_factory=list)
    masked: list[tuple[int, GrammarMatcher]] = field(default_factory=list)
    lp_reqs: list[Request] = field(default_factory=list)
    lp_pos: list[int] = field(default_factory=list)
    prompt_rows: list[tuple[Request, int, int]] = field(default_factory=list)
    prompt_at: list[int] = field(default_factory=list)
    prompt_targets: list[int] = field(default_factory=list)
    spec: SpecLayout | None = None
    draft_rows: list[int] | None = None  # rows of a draft model's q (engine/spec/draft.py)
    width: int = 0       # the widest block table of the step's requests
    num_tokens_total: int = 0

    @property
    def n(self) -> int:
        return len(self.requests)

    @classmethod
    def build(cls, sched: SchedulerOutput, batch: InputBatch, prev: dict[Request, int]) -> StepInputs:
        """`prev`: each request's position in the last step's sampled ids (overlap)."""
        s = cls(sched.requests, sched.num_tokens)
        drafts = sched.spec_token_ids
        layout = s.spec = SpecLayout(drafts) if drafts else None
        featured = batch.num_featured > 0
        row_of, num_blocks = batch.row_of, batch.num_blocks
        rows, seq_lens, ids, samplers, sample_pos = s.rows, s.seq_lens, s.ids, s.samplers, s.sample_pos
        width = pos = 0
        for i, (req, k) in enumerate(zip(s.requests, s.num_tokens)):
            row = row_of.get(req)
            if row is None:
                row = batch.add(req)
                featured = batch.num_featured > 0
            elif len(req.block_ids) != num_blocks[row]:
                batch.append_blocks(req, row)
            rows.append(row)
            start = req.num_computed_tokens
            end = start + k
            seq_lens.append(end)
            if num_blocks[row] > width:
                width = num_blocks[row]
            tokens = req.all_token_ids
            known = len(tokens)
            spec = drafts.get(req) if layout is not None else None
            if layout is not None:
                layout.add(i, pos, k, spec)
            if spec:  # the last token, then the drafts to verify; it samples, as a decode
                ids.append(tokens[start])
                ids += spec
                known = end
            elif end > known:  # the last input is the pending token of the step in flight
                ids += tokens[start:known]
                ids.append(0)
                s.src_at.append(pos + k - 1)
                s.src_idx.append(prev[req])
            elif k == 1:
                ids.append(tokens[start])
            else:
                ids += tokens[start:end]
            if featured and req.prompt_logprobs is not None and start < req.num_prompt_tokens - 1:
                s._add_prompt_rows(req, start, end, pos)
            pos += k
            if end == known + req.num_pending:
                samplers.append(req)
                sample_pos.append(i)
                if featured:
                    s._add_featured_sampler(req, i)
        s.width, s.num_tokens_total = width, pos
        return s

    def _add_prompt_rows(self, req: Request, start: int, end: int, pos: int) -> None:
        """Rows start..stop-1 of req (from token row `pos`) score prompt tokens start+1..stop."""
        stop = min(end, req.num_prompt_tokens - 1)
        self.prompt_rows.append((req, start, stop))
        self.prompt_at.extend(range(pos, pos + stop - start))
        self.prompt_targets += req.prompt_token_ids[start + 1:stop + 1]

    def _add_featured_sampler(self, req: Request, i: int) -> None:
        if req.grammar is not None:
            self.masked.append((i, req.grammar))
        if req.logprobs is not None:
            self.lp_reqs.append(req)
            self.lp_pos.append(i)

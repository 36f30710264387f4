"""Logits processors: penalties, logit bias, allowed tokens, bad words, min_tokens, min_p,
as batched tensor operations over a step's logits rows.

Per-row state lives on the device, indexed by the request's row in the InputBatch, and is
written when a request takes its row (a few kernel launches at admission, none per token):

    bias        [R, V] fp32  logit_bias; -inf outside allowed_token_ids and on bad words
    stop_mask   [R, V] bool  EOS and the request's stop_token_ids (what min_tokens holds off)
    prompt_mask [R, V] bool  the prompt's tokens (repetition_penalty counts them, as HF does)
    counts      [R, V] int32 output tokens so far, added on the device after each sample
    num_out / min_tokens / presence / frequency / repetition / min_p   [R]

A step gathers its rows of these (`rows`: each logits row's batch row) and applies, in
vLLM's order (SamplingParams' docstring gives the definitions):

    x = logits + bias[rows]                                  allowed, bad words, logit_bias
    x[stop_mask[rows] & (num_out < min_tokens)] = -inf       min_tokens
    seen = counts > 0 | prompt_mask                          repetition (transformers')
    x = where(seen, where(x > 0, x / rep, x * rep), x)
    x -= counts * frequency + (counts > 0) * presence        OpenAI's penalties

and `min_p` after temperature (engine/sampler.py). Each tensor is allocated with the first
request that needs it; while no running request uses a processor a step skips all of this
(`active` is 0), so it costs nothing. The logits handed to logprobs stay the model's raw
ones (the processed logits are a new tensor).

NOTE: counts are added on the device right after the step samples (`count`), for the rows
that sampled, so the next step sees them even before the host has read the token
(overlapped output processing). A request resumed after preemption gets its counts again
from its output tokens.
"""

from __future__ import annotations

import torch

from inflight.engine.request import Request

_NEG_INF = float("-inf")


class LogitsProcessors:
    def __init__(self, max_rows: int, vocab_size: int, device: torch.device,
                 eos_token_ids: frozenset[int] | tuple[int, ...] = ()):
        self.R, self.V, self.device = max_rows, vocab_size, device
        self.eos = [t for t in eos_token_ids if 0 <= t < vocab_size]
        self.rows: dict[Request, int] = {}       # requests with a processor, by row
        self.bias: torch.Tensor | None = None
        self.stop_mask: torch.Tensor | None = None
        self.prompt_mask: torch.Tensor | None = None
        self.counts: torch.Tensor | None = None
        self.num_out = torch.zeros(max_rows, dtype=torch.int32, device=device)
        self.min_tokens = torch.zeros(max_rows, dtype=torch.int32, device=device)
        self.presence = torch.zeros(max_rows, dtype=torch.float32, device=device)
        self.frequency = torch.zeros(max_rows, dtype=torch.float32, device=device)
        self.repetition = torch.ones(max_rows, dtype=torch.float32, device=device)
        self.min_p_row = torch.zeros(max_rows, dtype=torch.float32, device=device)
        self.num_bias = self.num_min_tokens = self.num_penalty = self.num_min_p = 0

    @property
    def active(self) -> int:
        return len(self.rows)

    def _table(self, name: str, dtype: torch.dtype, fill: float | bool | int) -> torch.Tensor:
        t = getattr(self, name)
        if t is None:
            t = torch.full((self.R, self.V), fill, dtype=dtype, device=self.device)
            setattr(self, name, t)
        return t

    def _ids(self, ids) -> torch.Tensor:
        return torch.tensor(list(ids), dtype=torch.long, device=self.device)

    # -- rows ----------------------------------------------------------------------------
    def add(self, req: Request, row: int) -> None:
        """req took `row`: write its state (a request without processors: nothing)."""
        p = req.params
        if not p.uses_logits_processors:
            return
        self.rows[req] = row
        static = req.banned_token_ids or p.logit_bias or p.allowed_token_ids is not None
        if static:
            bias = self._table("bias", torch.float32, 0.0)
            if p.allowed_token_ids is not None:
                bias[row].fill_(_NEG_INF)
                bias[row, self._ids(p.allowed_token_ids)] = 0.0
            else:
                bias[row].zero_()
            if p.logit_bias:
                ids = self._ids(p.logit_bias)
                vals = torch.tensor(list(p.logit_bias.values()), dtype=torch.float32, device=self.device)
                bias[row, ids] = bias[row, ids] + vals
            if req.banned_token_ids:
                bias[row, self._ids(req.banned_token_ids)] = _NEG_INF
            self.num_bias += 1
        self.num_out[row] = len(req.output_token_ids)
        if p.min_tokens:
            mask = self._table("stop_mask", torch.bool, False)
            mask[row].zero_()
            stop = [t for t in (*self.eos, *p.stop_token_ids) if 0 <= t < self.V]
            if stop:
                mask[row, self._ids(stop)] = True
            self.min_tokens[row] = p.min_tokens
            self.num_min_tokens += 1
        if p.uses_penalties:
            counts = self._table("counts", torch.int32, 0)
            prompt = self._table("prompt_mask", torch.bool, False)
            counts[row].zero_()
            if req.output_token_ids:
                out = self._ids(req.output_token_ids)
                counts[row].index_add_(0, out, torch.ones_like(out, dtype=torch.int32))
            prompt[row].zero_()
            prompt[row, self._ids(req.prompt_token_ids)] = True
            self.presence[row] = p.presence_penalty
            self.frequency[row] = p.frequency_penalty
            self.repetition[row] = p.repetition_penalty
            self.num_penalty += 1
        if p.min_p > 0:
            self.min_p_row[row] = p.min_p
            self.num_min_p += 1

    def remove(self, req: Request) -> None:
        row = self.rows.pop(req, None)
        if row is None:
            return
        p = req.params
        self.num_bias -= bool(req.banned_token_ids or p.logit_bias or p.allowed_token_ids is not None)
        if p.min_tokens:
            self.min_tokens[row] = 0
            self.num_min_tokens -= 1
        if p.uses_penalties:
            self.presence[row] = 0.0
            self.frequency[row] = 0.0
            self.repetition[row] = 1.0
            self.num_penalty -= 1
        if p.min_p > 0:
            self.min_p_row[row] = 0.0
            self.num_min_p -= 1

    # -- a step ----------------------------------------------------------------------------
    def apply(self, logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The processed logits (a new tensor) of logits rows whose batch rows are `rows`."""
        return apply_processors(
            logits, self.bias[rows] if self.num_bias else None,
            (self.stop_mask[rows], self.num_out[rows] < self.min_tokens[rows])
            if self.num_min_tokens else None,
            (self.counts[rows], self.prompt_mask[rows], self.repetition[rows],
             self.frequency[rows], self.presence[rows]) if self.num_penalty else None)

    def min_p(self, rows: torch.Tensor) -> torch.Tensor | None:
        return self.min_p_row[rows] if self.num_min_p else None

    def count(self, rows: torch.Tensor, sampled: torch.Tensor) -> None:
        """The step sampled `sampled` for batch rows `rows` (its sampler rows only)."""
        self.num_out.index_add_(0, rows, torch.ones_like(rows, dtype=torch.int32))
        if self.num_penalty:
            self.counts.index_put_((rows, sampled), torch.ones_like(rows, dtype=torch.int32),
                                   accumulate=True)


def apply_processors(logits: torch.Tensor, bias: torch.Tensor | None,
                     min_tokens: tuple[torch.Tensor, torch.Tensor] | None,
                     penalties: tuple[torch.Tensor, ...] | None) -> torch.Tensor:
    """The math, on gathered per-row tensors (module doc); returns a new tensor."""
    x = logits + bias if bias is not None else logits.clone()
    if min_tokens is not None:
        stop_mask, under = min_tokens
        x.masked_fill_(stop_mask & under[:, None], _NEG_INF)
    if penalties is not None:
        counts, prompt_mask, rep, freq, pres = penalties
        seen = (counts > 0) | prompt_mask
        x = torch.where(seen, torch.where(x > 0, x / rep[:, None], x * rep[:, None]), x)
        x = x - counts * freq[:, None] - (counts > 0) * pres[:, None]
    return x


def apply_min_p(scaled: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop (to -inf) tokens whose probability is below min_p times the row's top one
    (transformers' MinPLogitsWarper; `scaled`: logits after temperature)."""
    probs = scaled.softmax(dim=-1)
    top = probs.amax(dim=-1, keepdim=True)
    return scaled.masked_fill(probs < min_p[:, None] * top, _NEG_INF)

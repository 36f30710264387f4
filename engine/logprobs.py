"""Log-probabilities of tokens: what a request asked for with `SamplingParams.logprobs`
(each sampled token, plus the top n) and `prompt_logprobs` (each prompt token given the
ones before it), and `Engine.score`'s result.

NOTE: these are the model's own log-probabilities, log_softmax of the raw logits, before
temperature, top-k and top-p (vLLM's default "raw" logprobs): a sampled token's logprob
says how likely the model found it, whatever the sampling settings, and perplexity needs
exactly these. For a constrained request (structured_outputs) they are of the masked
distribution: log_softmax over the tokens its grammar allows at that position (the others
are -inf, and never listed among the alternatives).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from inflight.engine.sampling_params import MAX_LOGPROBS  # noqa: F401 (the limit of SamplingParams.logprobs)


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One position: the chosen token's log-probability and rank, and the `n` most likely
    tokens (token id, logprob), best first."""

    token_id: int
    logprob: float
    rank: int                                  # 1 = the model's most likely token
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class ScoreOutput:
    """`Engine.score` of one text: `logprobs[i]` = log p(token_ids[i] | token_ids[:i]);
    the first token has no context, so logprobs[0] is None."""

    token_ids: list[int]
    logprobs: list[float | None]

    @property
    def perplexity(self) -> float:
        """exp of the mean negative logprob over tokens 1..n-1 (nan for one token)."""
        vals = self.logprobs[1:]
        return math.exp(-sum(vals) / len(vals)) if vals else float("nan")


@dataclass
class LogprobRows:
    """Device results for R positions: the target's logprob and rank, the top n (n = the
    largest any of the rows asked for)."""

    logprob: torch.Tensor            # [R] fp32
    rank: torch.Tensor               # [R] int64
    top_ids: torch.Tensor | None     # [R, n] int64
    top_logprobs: torch.Tensor | None

    @classmethod
    def compute(cls, logits: torch.Tensor, targets: torch.Tensor, top_n: int) -> "LogprobRows":
        """logits [R, V] fp32, targets [R] int64."""
        lsm = logits.float().log_softmax(dim=-1)
        lp = lsm.gather(1, targets[:, None])[:, 0]
        rank = (lsm > lp[:, None]).sum(dim=-1) + 1
        top_lp, top_ids = lsm.topk(top_n, dim=-1) if top_n else (None, None)
        return cls(lp, rank, top_ids, top_lp)

    @classmethod
    def cat(cls, parts: list["LogprobRows"]) -> "LogprobRows":
        if len(parts) == 1:
            return parts[0]
        tops = [p.top_ids for p in parts]
        return cls(torch.cat([p.logprob for p in parts]), torch.cat([p.rank for p in parts]),
                   None if tops[0] is None else torch.cat(tops),
                   None if tops[0] is None else torch.cat([p.top_logprobs for p in parts]))

    def to_host(self, targets: list[int], ns: list[int]) -> list[TokenLogprob]:
        """One TokenLogprob per row, row i keeping its first ns[i] alternatives (one
        device-to-host copy per tensor)."""
        lps, ranks = self.logprob.tolist(), self.rank.tolist()
        ids = self.top_ids.tolist() if self.top_ids is not None else None
        tlp = self.top_logprobs.tolist() if self.top_logprobs is not None else None
        out = []
        for i, (tok, n) in enumerate(zip(targets, ns)):
            # a constrained row's forbidden tokens are -inf: never among the alternatives
            top = tuple((t, v) for t, v in zip(ids[i][:n], tlp[i][:n]) if v != NEG_INF) \
                if n and ids is not None else ()
            out.append(TokenLogprob(tok, lps[i], ranks[i], top))
        return out


NEG_INF = float("-inf")
PROMPT_CHUNK = 256  # prompt rows per LM-head piece: bounds the [rows, vocab] logits


@dataclass
class StepLogprobs:
    """The logprobs one step computes, on the device until `resolve` brings them to the host.

    - sampled tokens: `sample_pos` are positions in the step's requests (logits rows) whose
      request asked for `logprobs`; targets are the tokens sampled there;
    - prompt tokens: `spans` (request, index of its first entry, count) over the extra
      hidden rows the forward returned; targets are the next prompt tokens.
    """

    sample_pos: list[int]
    sample_ns: list[int]
    sample: LogprobRows | None
    spans: list[tuple[object, int, int]]
    prompt_targets: list[int]
    prompt_ns: list[int]
    prompt: LogprobRows | None
    width: int = 1                   # logit rows per request (k + 1 in a verification step)
    # filled by resolve():
    by_request: dict = None          # Request -> TokenLogprob of its sampled token
    prompt_entries: list = None      # [(Request, first index, [TokenLogprob])]

    @classmethod
    def build(cls, sample_reqs: list, sample_pos: list[int], sample: LogprobRows | None,
              prompt_rows: list, prompt: LogprobRows | None, targets: list[int],
              width: int = 1) -> "StepLogprobs":
        """`sample_reqs[j]` sits at logits row `sample_pos[j]` and `sample` holds its rows'
        results, in that order; `prompt_rows`: (request, start, stop) per request whose
        prompt positions start..stop-1 are, in order, the rows of `prompt` (position p
        scores prompt token p + 1: `targets`). A verification step has `width` rows per
        request (request i's at i * width + j, j < width): each such request has all of
        them in `sample`, and gets one entry per emitted token. The device step computed
        `sample` and `prompt` (ModelRunner.device_step); this is host bookkeeping."""
        ns = [r.params.logprobs for r in sample_reqs]
        if width > 1:
            ns = [v for v in ns for _ in range(width)]
        spans, pns = [], []
        for req, start, stop in prompt_rows:
            spans.append((req, start + 1, stop - start))
            pns += [req.params.prompt_logprobs] * (stop - start)
        return cls(sample_pos, ns, sample, spans, targets, pns, prompt, width)

    def resolve(self, requests: list, tokens: list) -> None:
        """Host copies; `tokens` are the step's sampled ids, one per request (a list of
        the emitted ones in a verification step: then each request gets a list of entries)."""
        self.by_request = {}
        if self.sample is not None and self.width > 1:
            W = self.width
            targets = [(tokens[i] + [0] * W)[j] for i in self.sample_pos for j in range(W)]
            entries = self.sample.to_host(targets, self.sample_ns)
            for at, i in enumerate(self.sample_pos):
                self.by_request[requests[i]] = entries[at * W:at * W + len(tokens[i])]
        elif self.sample is not None:
            targets = [tokens[i] for i in self.sample_pos]
            for i, entry in zip(self.sample_pos, self.sample.to_host(targets, self.sample_ns)):
                self.by_request[requests[i]] = entry
        self.prompt_entries = []
        if self.prompt is not None:
            entries = self.prompt.to_host(self.prompt_targets, self.prompt_ns)
            at = 0
            for req, first, count in self.spans:
                self.prompt_entries.append((req, first, entries[at:at + count]))
                at += count


def prompt_logprob_rows(model, hidden: torch.Tensor, targets: torch.Tensor, top_n: int) -> LogprobRows:
    """The prompt rows' results from their final hidden states [R, hidden] and the prompt
    tokens they score [R] (the LM head in pieces of PROMPT_CHUNK rows: a long prompt's
    [R, vocab] logits at once would be gigabytes).
    NOTE: `targets` comes from the step's staged copy: building it from a list would be a
    synchronous pageable copy in the middle of a launch."""
    return LogprobRows.cat([
        LogprobRows.compute(model.compute_logits(hidden[i:i + PROMPT_CHUNK]),
                            targets[i:i + PROMPT_CHUNK], top_n)
        for i in range(0, hidden.shape[0], PROMPT_CHUNK)])


def extend_prompt_logprobs(req, first: int, entries: list[TokenLogprob]) -> None:
    """Append a chunk's prompt entries (index `first` on); entries a recompute after a
    preemption produced again are skipped."""
    have = req.prompt_logprobs
    skip = len(have) - first
    if skip < len(entries):
        have.extend(entries[max(skip, 0):])

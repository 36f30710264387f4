"""A model-free engine for measuring the delivery path: tokens as fast as asked.

Every running request gets `tokens_per_step` tokens per step; a step "computes" for
`step_s` seconds by sleeping, as the host thread of a GPU engine waits on the device (it
releases the GIL, so the path's own threads run meanwhile). Up to `max_num_seqs` run at
once; the rest wait, first come first served. Outputs follow the Engine.step() contract
(COMMON.md): non-final outputs carry only `new_token_ids`/`text_delta`, the final one the
whole `token_ids`/`text`.

NOTE: it imports only `engine.outputs.RequestOutput`, which the worker of commit f1e85d1
has too, so `benchmarks/service.py --engine synthetic` runs the old worker on it (its fields
are in the same order: outputs are built from positional arguments, see step()).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from inflight.engine.outputs import RequestOutput

TOKEN_TEXT = "ab"  # what every token detokenizes to


@dataclass(slots=True)
class _Seq:
    request_id: str
    max_tokens: int
    base: int
    arrival: float
    count: int = 0                 # tokens made so far: token j is (base + j) % vocab
    first_token_time: float | None = None


NO_IDS: list[int] = []  # prompt_token_ids of every output (shared; nothing writes to it)


class SyntheticEngine:
    def __init__(self, *, max_num_seqs: int = 256, step_s: float = 0.001,
                 tokens_per_step: int = 1, vocab: int = 32_000, prompt_tokens: int = 16):
        self.max_num_seqs = max_num_seqs
        self.step_s = step_s
        self.k = tokens_per_step
        self.vocab = vocab
        self.prompt_tokens = prompt_tokens
        self.waiting: deque[_Seq] = deque()
        self.running: dict[str, _Seq] = {}
        self._pending: list[RequestOutput] = []
        # what the benchmark reads: first admission, last finish, tokens made, steps
        self.first_add: float | None = None
        self.last_finish: float | None = None
        self.tokens = 0
        self.finished = 0
        self.steps = 0
        self._texts = [TOKEN_TEXT * n for n in range(tokens_per_step + 1)]

    def add_request(self, request_id, prompt=None, prompt_token_ids=None, params=None,
                    priority=0, **kw) -> None:
        now = time.time()
        if self.first_add is None:
            self.first_add = now
        max_tokens = getattr(params, "max_tokens", 16) or 16
        self.waiting.append(_Seq(request_id, max_tokens, hash(request_id) % 1000, now))

    def abort(self, request_id: str) -> bool:
        seq = self.running.pop(request_id, None)
        if seq is None:
            for s in self.waiting:
                if s.request_id == request_id:
                    seq = s
                    self.waiting.remove(s)
                    break
        if seq is None:
            return False
        self._pending.append(self._final(seq, "abort", time.time()))
        return True

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting or self._pending)

    def step(self) -> list[RequestOutput]:
        outputs, self._pending = self._pending, []
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting.popleft()
            self.running[seq.request_id] = seq
        if not self.running:
            return outputs
        if self.step_s > 0:
            time.sleep(self.step_s)
        self.steps += 1
        now = time.time()
        # NOTE: the measuring instrument must cost little next to the path it measures: per
        # token only a one-element list and a RequestOutput built from positional arguments
        # (building token lists and keyword outputs cost more than the path's own share)
        k, vocab, texts, prompt = self.k, self.vocab, self._texts, self.prompt_tokens
        done = []
        made = 0
        for seq in self.running.values():
            c = seq.count
            n = k if c + k <= seq.max_tokens else seq.max_tokens - c
            new = [(seq.base + c) % vocab] if n == 1 else [
                (seq.base + c + j) % vocab for j in range(n)]
            seq.count = c + n
            made += n
            if seq.first_token_time is None:
                seq.first_token_time = now
            if seq.count >= seq.max_tokens:
                done.append(seq)
                out = self._final(seq, "length", now)
                out.new_token_ids, out.text_delta = new, texts[n]
                outputs.append(out)
            else:
                text = texts[n]
                outputs.append(RequestOutput(seq.request_id, new, text, new, text, False, None,
                                             None, prompt, 0, NO_IDS, seq.arrival,
                                             seq.first_token_time))
        self.tokens += made
        for seq in done:
            del self.running[seq.request_id]
        if done:
            self.finished += len(done)
            self.last_finish = now
        return outputs

    def _final(self, seq: _Seq, reason: str, now: float) -> RequestOutput:
        ids = [(seq.base + j) % self.vocab for j in range(seq.count)]
        return RequestOutput(seq.request_id, [], "", ids, TOKEN_TEXT * seq.count,
                             True, reason, num_prompt_tokens=self.prompt_tokens,
                             arrival_time=seq.arrival, first_token_time=seq.first_token_time,
                             finish_time=now)

"""A model-free engine for measuring the delivery path: tokens as fast as asked.

Every running request gets `tokens_per_step` tokens per step; a step "computes" for
`step_s` seconds by sleeping, as the host thread of a GPU engine waits on the device (it
releases the GIL, so the path's own threads run meanwhile). Up to `max_num_seqs` run at
once; the rest wait, first come first served. Outputs follow the Engine.step() contract
(COMMON.md): non-final outputs carry only `new_token_ids`/`text_delta`, the final one the
whole `token_ids`/`text`.

NOTE: it imports only `engine.outputs.RequestOutput`, which the worker of commit f1e85d1
has too, so `benchmarks/service.py --engine synthetic` runs the old worker on it.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from engine.outputs import RequestOutput

TOKEN_TEXT = "ab"  # what every token detokenizes to


@dataclass(slots=True)
class _Seq:
    request_id: str
    max_tokens: int
    base: int
    arrival: float
    out: list[int] = field(default_factory=list)
    first_token_time: float | None = None


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
        k, vocab, text = self.k, self.vocab, TOKEN_TEXT
        done = []
        for seq in self.running.values():
            n = min(k, seq.max_tokens - len(seq.out))
            start = seq.base + len(seq.out)
            new = [(start + j) % vocab for j in range(n)]
            seq.out.extend(new)
            if seq.first_token_time is None:
                seq.first_token_time = now
            if len(seq.out) >= seq.max_tokens:
                done.append(seq)
                out = self._final(seq, "length", now)
                out.new_token_ids, out.text_delta = new, text * n
                outputs.append(out)
            else:
                outputs.append(RequestOutput(seq.request_id, new, text * n, [], "", False,
                                             num_prompt_tokens=self.prompt_tokens,
                                             arrival_time=seq.arrival,
                                             first_token_time=seq.first_token_time))
            self.tokens += n
        for seq in done:
            del self.running[seq.request_id]
        if done:
            self.finished += len(done)
            self.last_finish = now
        return outputs

    def _final(self, seq: _Seq, reason: str, now: float) -> RequestOutput:
        return RequestOutput(seq.request_id, [], "", list(seq.out), TOKEN_TEXT * len(seq.out),
                             True, reason, num_prompt_tokens=self.prompt_tokens,
                             arrival_time=seq.arrival, first_token_time=seq.first_token_time,
                             finish_time=now)

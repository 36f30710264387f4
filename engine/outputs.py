"""What `Engine.step()` hands back: one `RequestOutput` per request that produced something."""

from __future__ import annotations

from dataclasses import dataclass, field

from inflight.engine.logprobs import TokenLogprob
from inflight.engine.request import Request


@dataclass(slots=True)
class RequestOutput:
    """A streaming delta of one request, or its final state.

    `new_token_ids`/`text_delta` are what this step added. On the final output (`finished`
    True) `token_ids`/`text` are the whole output and `finish_reason` is one of
    stop | length | abort | error | expired (`error` carries the message and `error_code` says whose
    fault it was: ERR_INVALID_REQUEST / ERR_PROMPT_TOO_LONG for the request itself,
    ERR_ENGINE for the engine's own trouble). Times are `time.time()`.

    NOTE: on non-final outputs `token_ids` and `text` are the delta too (the same objects
    as `new_token_ids` / `text_delta`): copying the whole output into every step's output
    made streaming quadratic. Read the deltas while streaming, the totals on the final.

    `logprobs` (when the request asked for them): one entry per token of `token_ids`, so a
    delta's on a non-final output and all of them on the final one. `prompt_logprobs`: on
    the final output only, one per prompt token, the first None. `stop_reason`: the stop
    string that ended the request (finish_reason "stop"; vLLM's field), else None.
    """

    request_id: str
    new_token_ids: list[int]
    text_delta: str
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    prompt_token_ids: list[int] = field(default_factory=list, repr=False)
    arrival_time: float = 0.0
    first_token_time: float | None = None
    finish_time: float | None = None
    num_preemptions: int = 0
    error_code: str | None = None
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    stop_reason: str | None = None  # on the final output: the stop string that ended it

    @classmethod
    def delta(cls, req: Request, new_token_ids: list[int], text_delta: str,
              logprobs: list[TokenLogprob] | None = None) -> RequestOutput:
        """A running request's tokens and text of this step (its totals are the delta)."""
        # NOTE: positional on purpose: one of these per running request per step, and
        # keywords cost ~1.4 us more each (the fields' order is right above)
        return cls(req.request_id, new_token_ids, text_delta, new_token_ids, text_delta, False,
                   None, None, req.num_prompt_tokens, max(req.num_cached_tokens, 0), [],
                   req.arrival_time, req.first_token_time, None, req.num_preemptions, None,
                   logprobs)

    @classmethod
    def final(cls, req: Request, text_delta: str, text: str, new_token_ids: list[int],
              error_code: str | None = None, stop_reason: str | None = None) -> RequestOutput:
        """A finished request's last delta and its whole output (`req.finish_reason`,
        `req.error` and `req.finish_time` set). The request is done: its lists are never
        changed again, so they are handed on without copies."""
        return cls(request_id=req.request_id, new_token_ids=new_token_ids, text_delta=text_delta,
                   token_ids=req.output_token_ids, text=text, finished=True,
                   finish_reason=req.finish_reason, error=req.error,
                   num_prompt_tokens=req.num_prompt_tokens,
                   num_cached_tokens=max(req.num_cached_tokens, 0),
                   prompt_token_ids=req.prompt_token_ids, arrival_time=req.arrival_time,
                   first_token_time=req.first_token_time, finish_time=req.finish_time,
                   num_preemptions=req.num_preemptions, error_code=error_code,
                   logprobs=req.logprobs, prompt_logprobs=req.prompt_logprobs,
                   stop_reason=stop_reason)

    @property
    def ttft(self) -> float | None:
        """Seconds from arrival to the first output token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def latency(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time

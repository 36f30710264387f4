"""What `Engine.step()` hands back: one `RequestOutput` per request that produced something."""

from __future__ import annotations

from dataclasses import dataclass, field

from inflight.engine.logprobs import TokenLogprob


@dataclass(slots=True)
class RequestOutput:
    """A streaming delta of one request, or its final state.

    `new_token_ids`/`text_delta` are what this step added. On the final output (`finished`
    True) `token_ids`/`text` are the whole output and `finish_reason` is one of
    stop | length | abort | error (`error` carries the message and `error_code` says whose
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

    @property
    def ttft(self) -> float | None:
        """Seconds from arrival to the first output token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def latency(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time

"""What `Engine.step()` hands back: one `RequestOutput` per request that produced something."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestOutput:
    """A streaming delta and the state so far of one request.

    `new_token_ids`/`text_delta` are what this step added; `token_ids`/`text` are the whole
    output so far. On the final output `finished` is True and `finish_reason` is one of
    stop | length | abort | error (`error` carries the message and `error_code` says whose
    fault it was: ERR_INVALID_REQUEST / ERR_PROMPT_TOO_LONG for the request itself,
    ERR_ENGINE for the engine's own trouble). Times are `time.time()`.
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

    @property
    def ttft(self) -> float | None:
        """Seconds from arrival to the first output token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def latency(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time

"""Limits per API key: requests per minute, tokens per minute, concurrent requests (and
queued batch tokens, checked when a batch is validated: producers/batch_enqueue.py).

    request ─► key (its limits) ─► owner's window from the store ─► handler
                                   (store/limits.py: one          submit: admit() or 429
                                    aggregate of its rows)        every answer: x-ratelimit-*

- Counted per owner (every key of one owner together), over the last minute of its
  `requests` rows, in the database every API process shares: two API processes see the
  same numbers (no per-process counters). The limits are the calling key's.
- A request's tokens: its prompt (exact for token ids, characters / 4 for text, rounded
  up) + max_tokens, reserved when it is filed; the recorder replaces them with the real
  prompt + completion tokens when it writes the final row (corrected on completion).
- Concurrent: the owner's interactive requests (not batch lines) queued or running.
- Over a limit: 429 with `Retry-After` (seconds; `retry-after-ms` too), which the official
  openai and anthropic SDKs wait before they retry (max_retries).
- Every answer to a key with limits carries OpenAI's headers
  x-ratelimit-limit-requests / -remaining-requests / -reset-requests and the -tokens ones.

NOTE: the check and the insert of the request's row are two statements, so two submits
racing at the very edge of a limit may both pass (over by at most the racing submits);
the next ones see both rows.
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from starlette.requests import Request

from inflight.api.errors import APIError
from inflight.store.limits import owner_window
from inflight.store.models import utcnow

WINDOW_S = 60.0
CONCURRENT_RETRY_S = 1.0  # a concurrency refusal: look again this soon


@dataclass(frozen=True)
class Limits:
    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None
    max_queued_tokens: int | None = None

    @classmethod
    def of(cls, info: Any) -> "Limits | None":
        """The limits of a key (KeyInfo); None when it has none of the per-request ones."""
        limits = cls(info.rpm, info.tpm, info.max_concurrent, info.max_queued_tokens)
        return limits if limits.per_request else None

    @property
    def per_request(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.max_concurrent is not None


@dataclass
class RateState:
    """The owner's window when this request came in (store.limits.OwnerWindow) and what
    this request added to it (admit)."""

    limits: Limits
    requests: int
    tokens: int
    in_flight: int
    reset_s: float  # until the oldest request of the window leaves it

    def headers(self) -> dict[str, str]:
        h: dict[str, str] = {}
        reset = _duration(self.reset_s)
        if self.limits.rpm is not None:
            h["x-ratelimit-limit-requests"] = str(self.limits.rpm)
            h["x-ratelimit-remaining-requests"] = str(max(0, self.limits.rpm - self.requests))
            h["x-ratelimit-reset-requests"] = reset
        if self.limits.tpm is not None:
            h["x-ratelimit-limit-tokens"] = str(self.limits.tpm)
            h["x-ratelimit-remaining-tokens"] = str(max(0, self.limits.tpm - self.tokens))
            h["x-ratelimit-reset-tokens"] = reset
        return h

    def admit(self, tokens: int) -> None:
        """Count one more request of `tokens` tokens, or APIError 429 saying which limit."""
        lim = self.limits
        if lim.max_concurrent is not None and self.in_flight + 1 > lim.max_concurrent:
            self._refuse(f"{self.in_flight} requests of this key's owner are queued or "
                         f"running, its limit of concurrent requests is {lim.max_concurrent}",
                         CONCURRENT_RETRY_S)
        if lim.rpm is not None and self.requests + 1 > lim.rpm:
            self._refuse(f"rate limit of {lim.rpm} requests per minute reached "
                         f"({self.requests} in the last minute)", self.reset_s)
        if lim.tpm is not None:
            if tokens > lim.tpm:
                self._refuse(f"this request needs {tokens} tokens (prompt + max_tokens), more "
                             f"than the key's {lim.tpm} tokens per minute: lower max_tokens",
                             self.reset_s, code="tokens_exceed_limit")
            if self.tokens + tokens > lim.tpm:
                self._refuse(f"rate limit of {lim.tpm} tokens per minute reached ({self.tokens} "
                             f"used in the last minute, this request needs {tokens})",
                             self.reset_s)
        self.requests += 1
        self.tokens += tokens
        self.in_flight += 1

    def _refuse(self, message: str, retry_s: float, code: str = "rate_limit_exceeded") -> None:
        retry_s = max(retry_s, 0.001)
        headers = self.headers() | {"Retry-After": str(max(1, math.ceil(retry_s))),
                                    "retry-after-ms": str(max(1, math.ceil(retry_s * 1000)))}
        raise APIError(429, message + f"; retry in {retry_s:.1f}s", code=code, headers=headers)


def state_of(limits: Limits, window: Any, now: datetime) -> RateState:
    """RateState from the store's OwnerWindow."""
    reset = (WINDOW_S - (now - window.oldest).total_seconds()) if window.oldest is not None else 0.0
    return RateState(limits, window.requests, window.tokens, window.in_flight,
                     min(max(reset, 0.0), WINDOW_S))


def request_tokens(req: Any) -> int:
    """A request's reserved tokens (InferenceRequest.token_estimate: the prompt, token ids
    exactly and text as characters / 4 rounded up, + max_tokens)."""
    return req.token_estimate


def _duration(seconds: float) -> str:
    """OpenAI's reset format: 120ms, 1s, 6m0s."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, secs = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


# the RateState of the request being handled (set by api.routing for the handler's task)
_current: ContextVar[RateState | None] = ContextVar("inflight_rate", default=None)


async def open_window(request: Request, principal: Any) -> RateState | None:
    """The caller's RateState (current for admit() and the headers), when its key has
    per-request limits; else None (and no RateState is current)."""
    limits = principal.limits
    if limits is None or principal.owner is None:
        _current.set(None)
        return None
    ctx = request.app.state.ctx
    now = utcnow()
    window = await ctx.db(owner_window, ctx.store, principal.owner, WINDOW_S, now)
    state = state_of(limits, window, now)
    _current.set(state)
    return state


def admit(req: Any) -> int:
    """Count a request about to be filed against the caller's limits (APIError 429 when
    over one); returns its reserved tokens (the row's `tokens`)."""
    tokens = request_tokens(req)
    state = _current.get()
    if state is not None:
        state.admit(tokens)
    return tokens

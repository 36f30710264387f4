"""The error bodies, for the OpenAPI document (api/errors.py writes them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """OpenAI's error shape."""

    error: ErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorBody(BaseModel):
    """Anthropic's error shape (routes under /v1/messages)."""

    type: Literal["error"]
    error: AnthropicErrorDetail


def _responses(model: type[BaseModel], statuses: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": model, "description": text} for status, text in statuses.items()}


_COMMON = {400: "invalid request (the message names the parameter)",
           401: "no, unknown or revoked API key", 404: "no such id (or another key's)",
           413: "body over the size cap", 503: "broker or database unavailable; retry"}
OPENAI_ERRORS = _responses(ErrorBody, _COMMON)
ANTHROPIC_ERRORS = _responses(AnthropicErrorBody, _COMMON)
SUBMIT_ERRORS = _responses(ErrorBody, {409: "request_id taken by another key"})
_WAIT = {409: "the request was cancelled or expired", 500: "the worker failed the request",
         504: "no final event in time"}
WAIT_ERRORS = _responses(ErrorBody, _WAIT)
ANTHROPIC_WAIT_ERRORS = _responses(AnthropicErrorBody, _WAIT)

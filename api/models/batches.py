"""OpenAI Batch and Anthropic Message Batch shapes, for bodies and the OpenAPI document.
The objects themselves are built by producers.batch_jobs (batch_object,
anthropic_batch_object); these models describe them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inflight.schemas.batch import CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL

Window = Annotated[str, Field(pattern=r"^[1-9][0-9]{0,5}[smhd]$",
                              description="how long the batch may take, e.g. 24h (N s|m|h|d)")]
Metadata = Annotated[dict[Annotated[str, Field(max_length=64)],
                          Annotated[str, Field(max_length=512)]], Field(max_length=16)]


class ExpiresAfter(BaseModel):
    """OpenAI's expiry policy: the output files expire `seconds` after the batch's creation."""
    model_config = ConfigDict(extra="forbid")
    anchor: Literal["created_at"]
    seconds: Annotated[int, Field(ge=1, le=2_592_000)]


class CreateBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_file_id: Annotated[str, Field(min_length=1, max_length=128)]
    endpoint: Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]
    completion_window: Window = "24h"
    metadata: Metadata | None = None
    output_expires_after: ExpiresAfter | None = None




class BatchError(BaseModel):
    code: str | None = None
    message: str | None = None
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class BatchObject(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str | None
    errors: BatchErrors | None
    input_file_id: str | None
    completion_window: str | None
    status: Literal["validating", "failed", "in_progress", "finalizing", "completed",
                    "expired", "cancelling", "cancelled"]
    output_file_id: str | None
    error_file_id: str | None
    created_at: int | None
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, Any] | None
    output_expires_after: ExpiresAfter | None = None
    x_progress: dict[str, int] = Field(description="validate/enqueue progress and the "
                                                   "cancelled/expired request counts")


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class MessageBatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    custom_id: Annotated[str, Field(min_length=1, max_length=512)]
    params: dict[str, Any] = Field(description="a Messages API request body")


class CreateMessageBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    requests: Annotated[list[MessageBatchRequest], Field(min_length=1)]


class MessageBatchCounts(BaseModel):
    processing: int
    succeeded: int
    errored: int
    canceled: int
    expired: int


class MessageBatchObject(BaseModel):
    id: str
    type: Literal["message_batch"] = "message_batch"
    processing_status: Literal["in_progress", "canceling", "ended"]
    request_counts: MessageBatchCounts
    ended_at: str | None
    created_at: str | None
    expires_at: str | None
    archived_at: str | None
    cancel_initiated_at: str | None
    results_url: str | None


class MessageBatchList(BaseModel):
    data: list[MessageBatchObject]
    has_more: bool
    first_id: str | None
    last_id: str | None


OPENAI_ENDPOINTS = (CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL)

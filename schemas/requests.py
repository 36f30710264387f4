"""An inference request as it travels on `inflight.requests` / `inflight.requests.batch`.

Priority: LOWER number = MORE urgent (like vLLM and Unix nice). Interactive requests
default to PRIORITY_INTERACTIVE (0); batch-file requests default to PRIORITY_BATCH (10).
The scheduler admits by (priority, arrival) and preempts the highest number first.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Annotated, Any, Literal

from pydantic import Field, JsonValue, ValidationInfo, model_validator

from inflight.engine.sampling_params import seed_for
from inflight.schemas.base import (SCHEMA_VERSION, FieldError, FiniteJson, ModelId, TopicName,
                                   WireId, WireModel)
from inflight.schemas.params import SamplingParams, StructuredOutputs, TokenId, WireSamplingParams
from inflight.schemas.tools import (MAX_TOOLS_FIELD, ToolCall, ToolChoice, choice_name,
                                    tool_constraint)

PRIORITY_INTERACTIVE = 0
PRIORITY_BATCH = 10
PRIORITY_MIN, PRIORITY_MAX = -1000, 1000

MAX_MESSAGES = 1024
MAX_PROMPT_TOKEN_IDS = 1_048_576
MAX_METADATA_KEYS = 64

Role = Literal["system", "developer", "user", "assistant", "tool"]
RequestKind = Literal["generate", "embed"]


class ChatMessage(WireModel):
    """One chat turn; the model's chat template turns a list of these into a prompt. An
    assistant turn may carry the `tool_calls` it made, a "tool" turn answers one
    (`tool_call_id`) with its result in `content`."""

    role: Role
    content: str
    name: str | None = Field(default=None, max_length=64)
    tool_calls: Annotated[list[ToolCall], Field(max_length=128)] | None = None
    tool_call_id: Annotated[str, Field(max_length=128)] | None = None


class InferenceRequest(WireModel):
    """Exactly one of `prompt`, `messages`, `prompt_token_ids` is set.

    `stream`: publish coalesced token deltas on the tokens topic. None (the default) = on
    for interactive priorities, off for batch ones (`wants_stream`); a request nobody
    streams costs only its status and final events.

    `submitted_at` is epoch seconds set by the client (defaults to now when built in
    Python; a decoded message without it gets the decode time). Streaming readers seek the
    results partition to this time.

    Validation context `{"max_prompt_chars": N}` (decode_request passes it) rejects prompts
    longer than N characters (messages: the sum of their contents).

    `model`: the model to run it (a model id the registry lists: `inflight models`, GET
    /v1/models). None (absent) = the deployment's default model, on today's topics; a named
    model goes to its own request topics (transport/model_topics.py), and a worker that
    reads a request for a model it does not serve ends it `model_not_found`.

    `tenant`: who the request is for (fair share in the scheduler, limits, usage). The HTTP
    API sets it from the caller's key owner; Kafka producers and `Client` set it themselves
    (trusted inside the data platform; a worker with INFLIGHT_REQUIRE_TENANT refuses a
    request without one). None = the anonymous tenant.

    `timeout` (seconds from `submitted_at`) / `deadline` (epoch seconds): a request not
    started by then ends `expired` without running; one running past it is stopped and ends
    `expired` with what it produced (finish_reason "expired"). Both given: the earlier wins
    (`expires_at`).

    `reply_to`: a topic that also gets the request's final event (and its token deltas when
    it streams), keyed by request_id, with the same headers; it must exist and match
    INFLIGHT_REPLY_TO_PATTERN (never one of the project's own topics), else the request
    ends at intake with an error final (code reply_to_refused) before it runs.

    `tools` / `tool_choice` / `parallel_tool_calls` (OpenAI's, with `messages`): the worker
    renders the tools into the prompt and reads calls out of the answer (FinalEvent
    .tool_calls); unless tool_choice is "none", the tools become the request's
    `params.structured_outputs` (schemas.tools.tool_constraint) when it has none.
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: WireId
    model: ModelId | None = None
    prompt: Annotated[str, Field(min_length=1)] | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)] | None = None
    prompt_token_ids: Annotated[list[TokenId], Field(min_length=1, max_length=MAX_PROMPT_TOKEN_IDS)] | None = None
    params: WireSamplingParams = Field(default_factory=SamplingParams)
    priority: int = Field(default=PRIORITY_INTERACTIVE, ge=PRIORITY_MIN, le=PRIORITY_MAX)
    batch_id: WireId | None = None
    metadata: Annotated[dict[Annotated[str, Field(min_length=1, max_length=128)], JsonValue],
                        FiniteJson, Field(max_length=MAX_METADATA_KEYS)] = Field(default_factory=dict)
    submitted_at: float = Field(default_factory=time.time, ge=0.0)
    stream: bool | None = None
    tools: MAX_TOOLS_FIELD | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reply_to: TopicName | None = None
    # "embed": an embedding request (a `prompt` or `prompt_token_ids`, no sampling): its
    # FinalEvent carries the vector (`embedding`), for a worker serving an embedding model
    # (schemas/embeddings.py); `dimensions` cuts the vector (Matryoshka), embed only
    kind: RequestKind = "generate"
    dimensions: int | None = Field(default=None, ge=1, le=65536)
    tenant: WireId | None = None
    timeout: float | None = Field(default=None, gt=0.0, le=366 * 86_400.0)
    deadline: float | None = Field(default=None, ge=0.0)

    @model_validator(mode="before")
    @classmethod
    def _tools_constrain(cls, data: Any) -> Any:
        """The tools' constraint as params.structured_outputs (when the request gives none)."""
        if not isinstance(data, dict) or not data.get("tools"):
            return data
        try:
            tag = tool_constraint(data["tools"], data.get("tool_choice") or "auto",
                                  data.get("parallel_tool_calls"))
        except (ValueError, TypeError, KeyError, AttributeError):
            return data  # the fields' own validation says what is wrong
        params = data.get("params")
        if tag is None or not isinstance(params, (dict, SamplingParams, type(None))):
            return data
        if isinstance(params, SamplingParams):
            given = params.structured_outputs
            given = given.to_dict() if given is not None else None
        else:
            params = dict(params or {})
            given = params.get("structured_outputs")
            if isinstance(given, StructuredOutputs):
                given = given.to_dict()
        if given is None:
            params = (dataclasses.replace(params, structured_outputs=tag)
                      if isinstance(params, SamplingParams) else {**params, "structured_outputs": tag})
        elif (given.get("structural_tag") if isinstance(given, dict) else None) != tag["structural_tag"]:
            raise FieldError("params.structured_outputs", "tools with tool_choice "
                             f"{data.get('tool_choice') or 'auto'!r} constrain the output "
                             "already: leave structured_outputs out, or set tool_choice 'none'")
        return {**data, "params": params}

    @model_validator(mode="after")
    def _exactly_one_input(self, info: ValidationInfo) -> "InferenceRequest":
        given = [name for name in ("prompt", "messages", "prompt_token_ids")
                 if getattr(self, name) is not None]
        if len(given) != 1:
            what = "none of them" if not given else " and ".join(given)
            raise FieldError(given[-1] if given else "prompt",
                             "set exactly one of 'prompt', 'messages', 'prompt_token_ids' "
                             f"(got {what})")
        if self.messages is not None and not any(m.content for m in self.messages):
            raise FieldError("messages", "every message content is empty; send some text")
        if self.tools is not None and self.messages is None:
            raise FieldError("tools", "tools go with chat messages (the chat template renders "
                             "them): send 'messages', not a prompt")
        if self.tool_choice is not None and self.tools is None:
            raise FieldError("tool_choice", "needs tools: give the functions in 'tools'")
        named = choice_name(self.tool_choice)
        if named is not None and named not in {t.function.name for t in self.tools}:
            raise FieldError("tool_choice", f"names function {named!r}, which is not among "
                             "the tools")
        if self.kind == "embed" and self.messages is not None:
            raise FieldError("messages", "an embedding request embeds a 'prompt' (text) or "
                             "'prompt_token_ids', not chat messages")
        if self.dimensions is not None and self.kind != "embed":
            raise FieldError("dimensions", "only an embedding request (kind 'embed') has dimensions")
        limit = (info.context or {}).get("max_prompt_chars") if info.context else None
        if limit is not None and self.prompt_chars > limit:
            raise FieldError(given[0], f"is {self.prompt_chars} characters, over the limit "
                             f"of {limit} (setting INFLIGHT_MAX_PROMPT_CHARS); shorten it",
                             code="prompt_too_long")
        return self

    @model_validator(mode="after")
    def _seed_fixed(self) -> "InferenceRequest":
        """A request without a seed gets one derived from its id (`seed_for`), fixed here,
        at submit, and carried with it: a redo after a worker died samples the same tokens,
        so a stream goes on where it broke."""
        if self.params.seed is None:
            object.__setattr__(self, "params",
                               dataclasses.replace(self.params, seed=seed_for(self.request_id)))
        return self

    @property
    def wants_stream(self) -> bool:
        """Whether the worker publishes token deltas (see `stream`)."""
        return self.stream if self.stream is not None else self.priority < PRIORITY_BATCH

    @property
    def expires_at(self) -> float | None:
        """Epoch seconds after which the request is useless (`timeout`, `deadline`), or None."""
        by_timeout = None if self.timeout is None else self.submitted_at + self.timeout
        if by_timeout is None or self.deadline is None:
            return by_timeout if self.deadline is None else self.deadline
        return min(by_timeout, self.deadline)

    @property
    def token_estimate(self) -> int:
        """Its tokens before it runs (what limits reserve): the prompt (token ids exactly;
        text: characters / 4, rounded up) + max_tokens."""
        if self.prompt_token_ids is not None:
            prompt = len(self.prompt_token_ids)
        else:
            prompt = -(-self.prompt_chars // 4)
        return prompt + self.params.max_tokens

    @property
    def prompt_chars(self) -> int:
        if self.prompt is not None:
            return len(self.prompt)
        if self.messages is not None:
            return sum(len(m.content) for m in self.messages)
        return 0

    def prompt_json(self) -> Any:
        """The prompt in a JSON-able form (what the store keeps)."""
        if self.prompt is not None:
            return self.prompt
        if self.messages is not None:
            return [m.model_dump(mode="json", exclude_none=True) for m in self.messages]
        return {"prompt_token_ids": list(self.prompt_token_ids or [])}

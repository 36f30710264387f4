"""OpenAI embedding shapes: the body of POST /v1/embeddings (and of an OpenAI Batch line
for /v1/embeddings) and the `list` of `embedding` objects we answer.

    {"model": "all-MiniLM-L6-v2", "input": ["a", "b"], "encoding_format": "float", "dimensions": 128}
    -> {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [...]}, ...],
        "model": "...", "usage": {"prompt_tokens": 9, "total_tokens": 9}}

`input`: a string, a list of strings, token ids, or a list of token-id lists (at most
MAX_INPUTS); `encoding_format` "base64" answers each vector as the base64 of its float32
little-endian bytes (what the openai SDK asks for by default, and decodes).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inflight.api.models.sampling import Strict
from inflight.schemas import InferenceRequest
from inflight.schemas.embeddings import decode_vector
from inflight.schemas.params import TokenId
from inflight.schemas.requests import MAX_PROMPT_TOKEN_IDS, PRIORITY_INTERACTIVE

MAX_INPUTS = 2048  # OpenAI's limit of inputs per request

TokenIds = Annotated[list[Annotated[TokenId, Strict]], Field(max_length=MAX_PROMPT_TOKEN_IDS)]
Input = (Annotated[str, Strict] | Annotated[list[Annotated[str, Strict]], Field(min_length=1, max_length=MAX_INPUTS)]
         | TokenIds | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_INPUTS)])


class EmbeddingRequest(BaseModel):
    """POST /v1/embeddings. `user` is accepted and ignored (OpenAI's abuse-tracking id)."""

    model_config = ConfigDict(extra="forbid")

    model: Annotated[str, Field(max_length=256)]
    input: Input
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1, le=65536, strict=True)] | None = None
    user: Annotated[str, Field(max_length=256)] | None = None

    @property
    def inputs(self) -> list[str | list[int]]:
        """One entry per vector asked for: a text or a token-id list."""
        x = self.input
        if isinstance(x, str):
            return [x]
        if not x:
            return [x]  # empty token ids: refused by input_errors
        if isinstance(x[0], int):
            return [x]
        return list(x)

    def input_errors(self) -> list[tuple[int, str]]:
        """(index, what is wrong) of the inputs that cannot be embedded."""
        bad = []
        for i, item in enumerate(self.inputs):
            if isinstance(item, str) and not item:
                bad.append((i, "is an empty string; send some text"))
            elif isinstance(item, list) and not item:
                bad.append((i, "is an empty token-id list; send at least one token"))
        return bad

    def to_wire(self, request_ids: list[str], max_prompt_chars: int) -> list[InferenceRequest]:
        """One embed request per input (SchemaError naming the field when one is bad)."""
        out = []
        for rid, item in zip(request_ids, self.inputs):
            field = {"prompt": item} if isinstance(item, str) else {"prompt_token_ids": item}
            out.append(InferenceRequest.model_validate(
                {"request_id": rid, "model": self.model, "kind": "embed", "dimensions": self.dimensions,
                 "priority": PRIORITY_INTERACTIVE, "stream": False, **field},
                context={"max_prompt_chars": max_prompt_chars}))
        return out


def embedding_item(index: int, b64: str, encoding_format: str) -> dict[str, Any]:
    """One `embedding` object from a final event's base64 vector."""
    vector: Any = b64 if encoding_format == "base64" else decode_vector(b64)
    return {"object": "embedding", "index": index, "embedding": vector}


def embedding_list(model: str, items: list[dict[str, Any]], prompt_tokens: int) -> dict[str, Any]:
    return {"object": "list", "data": items, "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}

"""Checking and converting the lines of a batch input file (the validate step).

A batch has one endpoint; every line must be a request for it:

    /v1/chat/completions, /v1/completions   OpenAI Batch lines {custom_id, method, url, body}
    /v1/messages                            Anthropic Message Batches lines {custom_id, params}

`LineChecker.check(line_no, raw)` returns the InferenceRequest or raises SchemaError with
the line number first; it also enforces unique custom_ids (it remembers them: ~60 bytes
each) and max_tokens within the model's context.

Models: a line's `model` (body.model, params.model) must be served (`models`: a lookup of
the live registry, producers/models_client.py); no model, `default` or the default model's
name is the default model. A file may mix models line by line, each line going to its
model's batch topic (`LineChecker.route_of`); with INFLIGHT_BATCH_ONE_MODEL_PER_FILE every
line must name the same model (OpenAI's rule).

The request_id is derived from (batch id, custom_id) -- `request_id_for` -- so the same
line always maps to the same request, whichever task publishes it and however often.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from inflight.schemas import SchemaError, Settings
from inflight.schemas.anthropic_batch import MESSAGES_URL, anthropic_batch_request
from inflight.schemas.base import ID_RE, MAX_ID_LEN
from inflight.schemas.batch import CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL, openai_batch_request
from inflight.schemas.codec import load_object
from inflight.schemas.json_text import refuse_nul
from inflight.schemas.errors import ConfigError, ModelNotFoundError
from inflight.schemas.events import ERR_MODEL_NOT_FOUND
from inflight.schemas.requests import PRIORITY_BATCH, InferenceRequest

if TYPE_CHECKING:
    from inflight.producers.models_client import ModelsClient

ENDPOINTS = (CHAT_URL, COMPLETIONS_URL, MESSAGES_URL, EMBEDDINGS_URL)
MAX_CUSTOM_ID = 512


def request_id_for(batch_id: str, custom_id: str) -> str:
    """`<batch>:<custom_id>` when that is a valid id, else `<batch>::<sha256 prefix>`.

    NOTE: a readable custom_id never starts with ':', so the two forms cannot collide."""
    rid = f"{batch_id}:{custom_id}"
    if len(rid) <= MAX_ID_LEN and ID_RE.match(custom_id):
        return rid
    return f"{batch_id}::{hashlib.sha256(custom_id.encode()).hexdigest()[:40]}"


def context_length(settings: Settings, model_dir: Path | None = None) -> int | None:
    """The model's context length without loading it: INFLIGHT_BATCH_CONTEXT_LENGTH, else
    max_position_embeddings from config.json in INFLIGHT_MODEL_PATH (or `model_dir`, the
    bundled model's folder that the CLI passes), capped by INFLIGHT_MAX_MODEL_LEN as the
    workers cap it; None when nothing is known."""
    if settings.batch_context_length is not None:
        return settings.batch_context_length
    cap = settings.max_model_len
    folder = Path(settings.model_path) if settings.model_path else model_dir
    if folder is None or not (folder / "config.json").is_file():
        return cap
    try:
        cfg = json.loads((folder / "config.json").read_text())
        length = int(cfg["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"cannot read max_position_embeddings from {folder / 'config.json'}: "
                          f"{exc}; set INFLIGHT_BATCH_CONTEXT_LENGTH") from exc
    return min(length, cap) if cap is not None else length


@dataclass(frozen=True)
class LineError:
    """One bad line, as OpenAI's Batch `errors.data` entry."""

    line: int
    message: str
    code: str = "invalid_request"
    param: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param,
                "line": self.line}


class Checked(NamedTuple):
    custom_id: str
    request: InferenceRequest


@dataclass(frozen=True)
class LineModel:
    """Where a line's model sends it."""

    model: str | None       # the request's `model` on the wire (None: the default model)
    name: str               # its name (the stored row's model)
    context: int | None     # its context length, when known
    topic: str              # its batch topic


# a line's model (None: it names none) -> LineModel, or None when no live worker serves it
ModelLookup = Callable[[str | None], "LineModel | None"]


def model_lookup(models: ModelsClient) -> ModelLookup:
    """A ModelLookup of the live registry (producers/models_client.py)."""

    def lookup(model: str | None) -> LineModel | None:
        try:
            route = models.route(model)
        except ModelNotFoundError:
            return None
        return LineModel(route.model, route.name, route.max_model_len, route.topic(batch=True))

    return lookup


class LineChecker:
    """Validates lines of one batch, in order; keeps the custom_ids seen so far."""

    def __init__(self, batch_id: str, endpoint: str, *, context: int | None,
                 max_prompt_chars: int | None, max_line_bytes: int | None,
                 models: ModelLookup | None = None, one_model: bool = False,
                 default_topic: str = "", tenant: str | None = None,
                 deadline: float | None = None):
        """`models`: where each line's model goes (None: every line is for the default
        model, of context `context`, on `default_topic`); `one_model`: every line must
        name the same model (INFLIGHT_BATCH_ONE_MODEL_PER_FILE). `tenant` / `deadline`:
        every line's (the batch's owner; the end of its completion window)."""
        if endpoint not in ENDPOINTS:
            raise SchemaError(f"endpoint {endpoint!r}: use one of {', '.join(ENDPOINTS)}",
                              field="endpoint")
        self.batch_id = batch_id
        self.endpoint = endpoint
        self.context = context
        self.max_prompt_chars = max_prompt_chars
        self.max_line_bytes = max_line_bytes
        self.models = models
        self.one_model = one_model
        self.default_topic = default_topic
        self.inherited = {k: v for k, v in (("tenant", tenant), ("deadline", deadline))
                          if v is not None}
        self.seen: set[str] = set()
        self.routes: dict[str | None, LineModel] = {}   # by the model a line names
        self.first_model: str | None = None

    def check(self, line_no: int, raw: bytes) -> Checked:
        """(custom_id, request) of line `line_no`, or SchemaError('line N: ...')."""
        try:
            return self.convert(raw)
        except SchemaError as e:
            raise SchemaError(f"line {line_no}: {e.message}", raw=e.raw, field=e.field,
                              request_id=e.request_id, code=e.code) from None

    def convert(self, raw: bytes) -> Checked:
        """(custom_id, request) of one line, or SchemaError naming the line's field."""
        # NOTE: the one parser (schemas.json_text) that enqueue and the output writer use
        # too: a BOM is dropped; bytes that are not UTF-8, a lone surrogate or a NUL are
        # refused here, so nothing that passes can fail later for its encoding
        data, obj = load_object(raw, max_bytes=self.max_line_bytes, what="batch line")
        return self.convert_object(obj, data)  # (which refuses a NUL)

    def convert_object(self, obj: dict[str, Any], data: bytes) -> Checked:
        """convert() of a line already parsed (the API's message batches: their requests
        arrive parsed, and a NaN re-encoded would read as null); `data` is its encoding."""
        try:
            refuse_nul(obj, data)
        except SchemaError as e:
            raise SchemaError(e.message, raw=data, field=e.field) from None
        cid = obj.get("custom_id")
        if not isinstance(cid, str) or not cid or len(cid) > MAX_CUSTOM_ID:
            raise SchemaError(f"custom_id: give a non-empty string of at most {MAX_CUSTOM_ID} "
                              f"characters (got {cid!r:.80})", raw=data, field="custom_id")
        if cid in self.seen:
            raise SchemaError(f"custom_id {cid!r:.80} appears on an earlier line; custom_ids "
                              "must be unique within a batch", raw=data, field="custom_id")
        rid = request_id_for(self.batch_id, cid)
        kw = {"request_id": rid, "batch_id": self.batch_id, "priority": PRIORITY_BATCH,
              "stream": False, "max_prompt_chars": self.max_prompt_chars}
        if self.endpoint == MESSAGES_URL:
            req = anthropic_batch_request(obj, data, **kw)
            where = "params.max_tokens"
        else:
            url = obj.get("url")
            if url != self.endpoint:
                raise SchemaError(f"url: every line of this batch must use {self.endpoint!r} "
                                  f"(the batch's endpoint; got {url!r:.80})", raw=data,
                                  field="url", request_id=rid)
            req = openai_batch_request(obj, data, **kw)
            where = "body.max_tokens"
        line_model = self._model(req, where.rsplit(".", 1)[0] + ".model", data, rid)
        if line_model.model != req.model:  # the default model, by any of its names: none
            req = req.model_copy(update={"model": line_model.model, **self.inherited})
        elif self.inherited:
            req = req.model_copy(update=self.inherited)
        context = line_model.context
        # NOTE: only a max_tokens the line sets is checked; the default is capped by the
        # engine at the context length, as OpenAI's default fills the remaining context.
        given = obj.get("params" if self.endpoint == MESSAGES_URL else "body")
        sets_max = isinstance(given, dict) and ("max_tokens" in given or "max_completion_tokens" in given)
        if context is not None and sets_max:
            n_ids = len(req.prompt_token_ids or ())
            if req.params.max_tokens + n_ids > context:
                extra = f" plus {n_ids} prompt tokens" if n_ids else ""
                raise SchemaError(f"{where}: {req.params.max_tokens}{extra} exceeds the model's "
                                  f"context of {context} tokens; lower it", raw=data,
                                  field=where, request_id=rid, code="prompt_too_long")
        self.seen.add(cid)
        return Checked(cid, req)

    def route_of(self, req: InferenceRequest) -> LineModel:
        """Where a checked request goes (its model's batch topic, its model's name)."""
        return self._lookup(req.model)

    def _lookup(self, model: str | None) -> LineModel | None:
        """The line model of `model` (remembered: a file names few models)."""
        if model in self.routes:
            return self.routes[model]
        if self.models is None:
            found = LineModel(None, "default", self.context, self.default_topic) \
                if model is None else None
        else:
            found = self.models(model)
        if found is not None:
            self.routes[model] = found
        return found

    def _model(self, req: InferenceRequest, field: str, data: bytes, rid: str) -> LineModel:
        """The line's model, served (else SchemaError model_not_found naming it), and the
        same as the earlier lines' where one model per file is the rule."""
        found = self._lookup(req.model)
        if found is None:
            raise SchemaError(f"{field}: model {req.model!r} is not served (no live worker "
                              "announces it; GET /v1/models, `inflight models` list the "
                              "served ones); name a served model, or leave it out for the "
                              "default model", raw=data, field=field, request_id=rid,
                              code=ERR_MODEL_NOT_FOUND)
        if self.one_model:
            if self.first_model is None:
                self.first_model = found.name
            elif found.name != self.first_model:
                raise SchemaError(f"{field}: model {found.name!r} differs from "
                                  f"{self.first_model!r} of the lines before; this deployment "
                                  "takes one model per batch file "
                                  "(INFLIGHT_BATCH_ONE_MODEL_PER_FILE): split the file by model",
                                  raw=data, field=field, request_id=rid, code="mixed_models")
        return found

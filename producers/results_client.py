"""Reading results from the store: what `Client.result` and `Client.wait_many` do.

    results = ResultsClient(settings)          # opens the store at the first read
    results.result(rid)                         # Result(status="completed", text=..., ...)
    results.wait_many([rid, ...], timeout=60)   # {id: Result} of those that ended

The store is the queryable state of the results log (the recorder writes it); a request it
does not know is `Result(status="not_found")`. Waiting on one request through its final
event on Kafka is the requests side's (producers/requests_client.py: Client.wait).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from inflight.schemas import Settings
from inflight.schemas.embeddings import unpack_vector
from inflight.schemas.errors import InflightError
from inflight.store import FINAL_STATUSES, Store

NOT_FOUND = "not_found"


class RequestNotFound(InflightError, LookupError):
    """No request with this id is known (not in the store, nothing on the results topic)."""


@dataclass
class Result:
    """A request as the store knows it. `status` is "not_found" for an unknown id."""

    request_id: str
    status: str
    text: str | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    error: str | None = None
    error_code: str | None = None
    token_ids: list[int] | None = None
    batch_id: str | None = None
    worker: str | None = None
    created_at: float | None = None
    finished_at: float | None = None
    logprobs: dict[str, Any] | None = None  # requests.logprobs (see store.rows.logprobs_column)
    tool_calls: list[dict[str, Any]] | None = None  # a request with tools: its answer's calls
    model: str | None = None  # the model it named, then the one that ran it
    trace_id: str | None = None  # the W3C trace id of its traceparent (docs/tracing.md)
    embedding: list[float] | None = None  # an embedding request's vector
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def found(self) -> bool:
        return self.status != NOT_FOUND

    @property
    def done(self) -> bool:
        return self.status in FINAL_STATUSES

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra")
        return d


class ResultsClient:
    """Store reads of requests; owns the store it opens (a given one is closed too)."""

    def __init__(self, settings: Settings, store: Store | None = None):
        self.settings = settings
        self._store = store

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store.embedded(self.settings.database_url,
                                         files_url=self.settings.files_url,
                                         files_endpoint=self.settings.files_s3_endpoint)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def result(self, request_id: str) -> Result:
        """The stored state of a request; status "not_found" for an unknown id."""
        row = self.store.get_request(request_id)
        if row is None:
            return Result(request_id, NOT_FOUND)
        return Result(request_id, row.status, text=row.output, finish_reason=row.finish_reason,
                      usage=row.usage, timings=row.timings, error=row.error,
                      error_code=row.error_code, token_ids=row.output_token_ids,
                      batch_id=row.batch_id, worker=row.worker,
                      created_at=row.created_at.timestamp() if row.created_at else None,
                      finished_at=row.finished_at.timestamp() if row.finished_at else None,
                      logprobs=row.logprobs, tool_calls=row.tool_calls, model=row.model,
                      trace_id=row.trace_id,
                      embedding=None if row.embedding is None else unpack_vector(row.embedding))

    def wait_many(self, request_ids: Iterable[str], timeout: float | None = None,
                  poll_s: float = 0.2) -> dict[str, Result]:
        """Poll the store until every request is final or `timeout` seconds pass: {id:
        Result} of those that ended."""
        ids = list(request_ids)
        deadline = None if timeout is None else time.monotonic() + timeout
        done: dict[str, Result] = {}
        while True:
            rows = self.store.get_requests([i for i in ids if i not in done])
            for rid, row in rows.items():
                if row.status in FINAL_STATUSES:
                    done[rid] = self.result(rid)
            if len(done) == len(ids) or (deadline is not None and time.monotonic() >= deadline):
                return done
            time.sleep(poll_s)

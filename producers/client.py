"""The producer client: submit prompts, poll results from the store, stream tokens.

    client = Client(Settings())
    rid = client.submit("Hello", SamplingParams(max_tokens=32, temperature=0))
    for event in client.stream(rid):      # TokenEvent..., then FinalEvent | ErrorEvent
        print(event.text, end="")
    client.result(rid)                    # Result(status="completed", text=..., ...)

The request_id is the idempotency key and the Kafka key (so all events of a request sit
in one results partition). Priority >= PRIORITY_BATCH goes to the batch topic.

Batch jobs (run by the Celery workers of `inflight jobs`; see producers.batch_jobs):

    b = client.create_batch("in.jsonl", endpoint="/v1/chat/completions", completion_window="24h")
    client.get_batch(b.id).status         # validating → in_progress → finalizing → completed
    client.cancel_batch(b.id); client.list_batches(); client.wait_batch(b.id, timeout=...)
    for line in client.batch_results(b.id): ...            # output lines (dicts), input order
"""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson
from kafka import KafkaProducer
from kafka.errors import KafkaError
from pydantic import ValidationError

from inflight.schemas import (PRIORITY_BATCH, PRIORITY_INTERACTIVE, ErrorEvent, FinalEvent,
                     InferenceRequest, SamplingParams, SchemaError, Settings, TokenEvent,
                     decode_result, encode)
from inflight.schemas.cancel import batch_cancel, request_cancel
from inflight.schemas.codec import schema_error
from inflight.schemas.errors import (BrokerError, CapacityError, InflightError, StateError,
                                     needs_extra)
from inflight.schemas.kafka_clients import producer
from inflight.store import FINAL_STATUSES, BatchRow, FileRow, Store

# NOTE: batch jobs (producers.batch_jobs) and Celery (producers.celery_app, the `jobs`
# extra) load at the first batch call: a pipeline that submits and polls never imports them
from inflight.producers.results_reader import ResultsReader
from inflight.producers.stream import partition_for

NOT_FOUND = "not_found"
STREAM_CLOCK_SLACK_S = 5.0   # a submit time of another process: this much earlier (clock skew)
STREAM_LOOKBACK_S = 3600.0   # unknown submit time: look back this far
MAX_FOLLOWS = 10_000         # requests one Client streams or waits on at once
WAIT_STORE_EVERY_S = 2.0     # Client.wait: the store is asked this often meanwhile


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


def _request(item: Any, params: SamplingParams | Mapping | None = None, *,
             request_id: str | None = None, priority: int | None = None,
             metadata: Mapping | None = None, batch_id: str | None = None,
             tools: list | None = None, tool_choice: Any = None) -> InferenceRequest:
    if isinstance(item, InferenceRequest):
        return item
    fields: dict[str, Any] = {}
    if isinstance(item, Mapping):
        fields.update(item)
    elif isinstance(item, str):
        fields["prompt"] = item
    elif isinstance(item, list) and item and all(isinstance(t, int) for t in item):
        fields["prompt_token_ids"] = item
    elif isinstance(item, list):
        fields["messages"] = item
    else:
        raise SchemaError(f"submit: give a prompt string, chat messages, token ids or an "
                          f"InferenceRequest (got {type(item).__name__})")
    if params is not None:
        fields["params"] = params if isinstance(params, SamplingParams) else dict(params)
    if request_id is not None:
        fields["request_id"] = request_id
    fields.setdefault("request_id", uuid.uuid4().hex)
    if priority is not None:
        fields["priority"] = priority
    if metadata:
        fields["metadata"] = dict(metadata)
    if batch_id is not None:
        fields["batch_id"] = batch_id
    if tools is not None:
        fields["tools"] = tools
    if tool_choice is not None:
        fields["tool_choice"] = tool_choice
    fields.setdefault("submitted_at", time.time())
    try:
        return InferenceRequest.model_validate(fields)
    except ValidationError as exc:  # one SchemaError naming the first bad field
        raise schema_error(exc, raw=None, request_id=fields.get("request_id"),
                           model=InferenceRequest) from None


class Client:
    def __init__(self, settings: Settings | None = None, *, store: Store | None = None,
                 results: ResultsReader | None = None, max_follows: int = MAX_FOLLOWS):
        """`results`: a results reader to share (the API's); by default the Client starts
        its own at the first stream or wait (one per Client, whatever it follows)."""
        self.settings = settings or Settings()
        self._store = store
        self._producer: KafkaProducer | None = None
        self._celery: Any = None
        self._submitted: dict[str, float] = {}
        self._results = results
        self._own_results = results is None
        self.max_follows = max_follows

    # -- connections ----------------------------------------------------------------------
    @property
    def producer(self) -> KafkaProducer:
        if self._producer is None:
            # batch_size: bulk sends (submit_many, batch enqueue) fill few large batches;
            # at the 16 KiB default kafka-python woke its sender thread every ~16 messages,
            # which cost more CPU than the sends themselves
            self._producer = producer(self.settings, linger_ms=5,
                                      batch_size=min(512 << 10, self.settings.kafka_max_message_bytes))
        return self._producer

    @property
    def results(self) -> ResultsReader:
        """The one reader of the results topics that Client.stream and Client.wait share."""
        if self._results is None:
            self._results = ResultsReader(self.settings, max_follows=self.max_follows,
                                          name="client").start()
        return self._results

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store.embedded(self.settings.database_url)
        return self._store

    def close(self) -> None:
        if self._results is not None and self._own_results:
            self._results.close()
            self._results = None
        if self._producer is not None:
            self._producer.flush()
            self._producer.close()
            self._producer = None
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._celery is not None:
            self._celery.close()
            self._celery = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- submit -----------------------------------------------------------------------------
    def topic_for(self, req: InferenceRequest) -> str:
        s = self.settings
        return s.topic_requests_batch if req.priority >= PRIORITY_BATCH else s.topic_requests

    def submit(self, prompt: Any = None, params: SamplingParams | Mapping | None = None, *,
               messages: list | None = None, request_id: str | None = None,
               priority: int = PRIORITY_INTERACTIVE, metadata: Mapping | None = None,
               batch_id: str | None = None, flush: bool = True, tools: list | None = None,
               tool_choice: Any = None) -> str:
        """Publish one request; returns its request_id (a given one is kept).
        `params` may constrain the output (`{"structured_outputs": {"json": SCHEMA}}`, or
        SamplingParams(structured_outputs=...)); `tools` / `tool_choice` (OpenAI's, with
        `messages`) make the answer's tool calls come back on the result (`tool_calls`)."""
        req = _request(messages if messages is not None else prompt, params,
                       request_id=request_id, priority=priority, metadata=metadata,
                       batch_id=batch_id, tools=tools, tool_choice=tool_choice)
        self._publish(req)
        if flush:
            self.flush()
        return req.request_id

    def _publish(self, req: InferenceRequest) -> None:
        self.send(req)
        self._submitted[req.request_id] = req.submitted_at

    def send(self, req: InferenceRequest) -> Any:
        """Publish one request without flushing or remembering it (long-running servers);
        returns kafka-python's future, done when Kafka acknowledged the record."""
        value = encode(req)
        if len(value) > self.settings.kafka_max_message_bytes:
            raise SchemaError(f"request {req.request_id} is {len(value)} bytes, over the limit "
                              f"of {self.settings.kafka_max_message_bytes} "
                              "(INFLIGHT_KAFKA_MAX_MESSAGE_BYTES); shorten the prompt",
                              request_id=req.request_id, code="message_too_large")
        try:
            return self.producer.send(self.topic_for(req), key=req.request_id.encode(), value=value)
        except KafkaError as exc:
            raise BrokerError(f"publishing {req.request_id} failed: {exc}") from exc

    def flush(self, timeout: float | None = 30) -> None:
        if self._producer is not None:
            try:
                self._producer.flush(timeout=timeout)
            except KafkaError as exc:
                raise BrokerError(f"the broker did not acknowledge the requests: {exc}") from exc

    def submit_many(self, items: Iterable[Any], params: SamplingParams | Mapping | None = None, *,
                    priority: int | None = None, batch_id: str | None = None,
                    progress: bool | None = None, flush_every: int = 1000) -> list[str]:
        """Publish many requests (strings, messages, dicts of request fields or
        InferenceRequests); a progress bar shows on long inputs. Returns the ids in order."""
        from tqdm import tqdm

        total = len(items) if hasattr(items, "__len__") else None  # type: ignore[arg-type]
        show = progress if progress is not None else (total is None or total >= 200)
        ids = []
        with tqdm(total=total, disable=not show, unit="req", desc="submit") as bar:
            for item in items:
                req = _request(item, params, priority=priority, batch_id=batch_id)
                self._publish(req)
                ids.append(req.request_id)
                bar.update(1)
                if len(ids) % flush_every == 0:
                    self.flush()
            self.flush()
        return ids

    def cancel(self, request_id: str) -> None:
        """Ask every worker to abort this request (it ends `cancelled`)."""
        self.cancel_many([request_id])

    def cancel_many(self, request_ids: Iterable[str]) -> int:
        """Send a cancel for each id, then wait for the broker's acknowledgement."""
        n = 0
        try:
            for rid in request_ids:
                key, value = request_cancel(rid)
                self.producer.send(self.settings.topic_cancel, key=key, value=value)
                n += 1
        except KafkaError as exc:
            raise BrokerError(f"publishing cancels failed: {exc}") from exc
        self.flush()
        return n

    def cancel_batch_requests(self, batch_id: str) -> None:
        """One cancel for every request of the batch (the queued ones end `cancelled`
        without running), then wait for the broker's acknowledgement. `cancel_batch` moves
        the batch itself to `cancelling` and sends this."""
        key, value = batch_cancel(batch_id)
        try:
            self.producer.send(self.settings.topic_cancel, key=key, value=value)
        except KafkaError as exc:
            raise BrokerError(f"publishing the cancel of batch {batch_id} failed: {exc}") from exc
        self.flush()

    def publish_encoded(self, items: Iterable[tuple[str, bytes]], *, topic: str) -> int:
        """Send already-encoded requests (request_id, bytes) to `topic` and flush (the batch
        enqueue task: it encoded and size-checked them while validating)."""
        n = 0
        try:
            for rid, value in items:
                self.producer.send(topic, key=rid.encode(), value=value)
                n += 1
        except KafkaError as exc:
            raise BrokerError(f"publishing to {topic} failed: {exc}") from exc
        self.flush()
        return n

    # -- results ------------------------------------------------------------------------------
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
                      logprobs=row.logprobs, tool_calls=row.tool_calls)

    def wait(self, request_id: str, timeout: float | None = None, poll_s: float = 0.1) -> Result:
        """Wait until the request is final in the store or `timeout` seconds pass; returns
        the last state seen (check `.done`). A known request is waited on through the
        results reader (its final event, then the recorder's row); meanwhile the store is
        asked every WAIT_STORE_EVERY_S (a row ended by the store alone ends the wait)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        res = self.result(request_id)
        if res.done or (deadline is not None and time.monotonic() >= deadline):
            return res
        if res.found or request_id in self._submitted:
            self._await_final(request_id, deadline)
        while True:
            res = self.result(request_id)
            if res.done or (deadline is not None and time.monotonic() >= deadline):
                return res
            time.sleep(poll_s)

    def _await_final(self, request_id: str, deadline: float | None) -> None:
        """Until the request's final event is read, its row is final (a batch's cancel
        grace ends rows without an event; the store is asked every WAIT_STORE_EVERY_S) or
        the deadline passes; quietly returns if the results topics cannot be read (the
        store is polled instead)."""
        try:
            with self.results.follow(request_id, since=self._since(request_id)) as f:
                while not f.finished:
                    until = time.monotonic() + WAIT_STORE_EVERY_S
                    if deadline is not None:
                        until = min(until, deadline)
                    try:
                        f.get(until)
                    except TimeoutError:
                        if (deadline is not None and time.monotonic() >= deadline) or \
                                self.result(request_id).done:
                            return
        except (BrokerError, CapacityError):
            pass

    def wait_many(self, request_ids: Iterable[str], timeout: float | None = None,
                  poll_s: float = 0.2) -> dict[str, Result]:
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

    # -- streaming ----------------------------------------------------------------------------
    def _since(self, request_id: str, since: float | None = None) -> float:
        """An instant before which no event of the request was appended (this host's
        clock): its submit time if this Client submitted it; a time from elsewhere (the
        store's, a caller's) STREAM_CLOCK_SLACK_S earlier; unknown: STREAM_LOOKBACK_S back."""
        if since is not None:
            return since - STREAM_CLOCK_SLACK_S
        if request_id in self._submitted:
            return self._submitted[request_id]
        try:
            res = self.result(request_id)
        except InflightError:
            res = Result(request_id, NOT_FOUND)
        if res.created_at is not None:
            return res.created_at - STREAM_CLOCK_SLACK_S
        return time.time() - STREAM_LOOKBACK_S

    def stream(self, request_id: str, timeout: float = 120.0,
               since: float | None = None) -> Iterator[TokenEvent | FinalEvent | ErrorEvent]:
        """Token deltas of one request in index order, then its final event (see
        producers/stream.py: an index-0 delta after others starts the text over, on a new
        attempt; the deltas since the last index 0 add up to the final's text).

        Follows the request through the Client's one results reader (no consumer of its
        own), replaying from the submit time (`since`, else this Client's or the store's;
        the reader finds the offsets from its checkpoints or `offsets_for_times`, never
        "latest"), so a stream started after the request finished still returns its whole
        text. Raises RequestNotFound when no final event shows up within `timeout` seconds.
        """
        start = self._since(request_id, since)
        deadline = time.monotonic() + timeout
        with self.results.follow(request_id, since=start) as f:
            yield from f.events(deadline, lambda: RequestNotFound(
                self._not_found_message(request_id, timeout)))

    def _not_found_message(self, request_id: str, timeout: float) -> str:
        res = self.result(request_id)
        if res.found:
            return (f"request {request_id} is {res.status} but no final event arrived within "
                    f"{timeout:.0f}s; is a worker running? (`inflight worker`)")
        return (f"request {request_id} not found: nothing in the store and no events on "
                f"{self.settings.topic_results} within {timeout:.0f}s")

    # -- batch jobs (see producers.batch_jobs) ---------------------------------------------
    @property
    def celery(self) -> Any:
        """The Celery app batch tasks are sent with (MissingExtraError without `jobs`)."""
        if self._celery is None:
            with needs_extra("jobs", "sending batch jobs (Client.create_batch)"):
                from inflight.producers.celery_app import celery_app

                self._celery = celery_app(self.settings)
        return self._celery

    def upload_file(self, source: str | Path | bytes | BinaryIO, *, purpose: str = "batch",
                    filename: str | None = None, owner: str | None = None,
                    progress: bool = False) -> FileRow:
        """Store a file (a path, bytes or a binary file object), streamed in 1 MiB pieces."""
        from tqdm import tqdm

        if isinstance(source, (str, Path)):
            path = Path(source)
            try:
                fh: BinaryIO = open(path, "rb")
            except OSError as exc:
                raise SchemaError(f"cannot read {path}: {exc.strerror}") from None
            name, total = filename or path.name, path.stat().st_size
        elif isinstance(source, (bytes, bytearray)):
            fh, name, total = io.BytesIO(source), filename or "input.jsonl", len(source)
        else:
            fh, name, total = source, filename or getattr(source, "name", "input.jsonl"), None
        with fh, tqdm(total=total, unit="B", unit_scale=True, desc="upload",
                      disable=not progress) as bar:
            return self.store.create_file(iter(lambda: fh.read(1 << 20), b""), purpose=purpose,
                                          filename=str(name), owner=owner, progress=bar.update)

    def create_batch(self, source: str | Path | bytes | BinaryIO | None = None, *,
                     input_file_id: str | None = None,
                     endpoint: str = "/v1/chat/completions", completion_window: str = "24h",
                     metadata: Mapping[str, str] | None = None, owner: str | None = None,
                     progress: bool = False) -> BatchRow:
        """Upload `source` (or use an uploaded `input_file_id`), create a `validating`
        batch and hand it to the Celery workers (`inflight jobs`) to validate and enqueue."""
        if (source is None) == (input_file_id is None):
            raise SchemaError("create_batch: give a file to upload or an input_file_id (one)")
        app = self.celery  # first: no file is stored for a batch that cannot start (no `jobs`)
        from inflight.producers import batch_jobs
        from inflight.producers.celery_app import send_enqueue

        if input_file_id is None:
            input_file_id = self.upload_file(source, owner=owner, progress=progress).id  # type: ignore[arg-type]
        b = batch_jobs.create_batch(self.store, input_file_id=input_file_id, endpoint=endpoint,
                                    completion_window=completion_window,
                                    metadata=dict(metadata) if metadata else None, owner=owner)
        send_enqueue(app, b.id)
        return b

    def get_batch(self, batch_id: str) -> BatchRow:
        """The batch row (NotFoundError for an unknown id); batch_jobs.batch_object(row)
        gives the OpenAI JSON."""
        return self.store.require_batch(batch_id)

    def list_batches(self, *, limit: int = 20, after: str | None = None,
                     owner: str | None = None) -> list[BatchRow]:
        return self.store.list_batches(limit=limit, after=after, owner=owner)

    def cancel_batch(self, batch_id: str) -> BatchRow:
        from inflight.producers import batch_jobs

        return batch_jobs.cancel_batch(self.store, self, batch_id)

    def wait_batch(self, batch_id: str, timeout: float | None = None,
                   poll_s: float = 0.5) -> BatchRow:
        """Poll until the batch is completed/failed/expired/cancelled or `timeout` passes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            b = self.get_batch(batch_id)
            if b.is_final or (deadline is not None and time.monotonic() >= deadline):
                return b
            time.sleep(poll_s)

    def batch_file_lines(self, batch_id: str, *, errors: bool = False) -> Iterator[bytes]:
        """Raw lines of the batch's output file (or error file); none while it has none.
        StateError while the batch has not ended."""
        b = self.get_batch(batch_id)
        if not b.is_final:
            raise StateError(f"batch {batch_id} is {b.status}; results exist once it is "
                             "completed, expired or cancelled")
        fid = b.error_file_id if errors else b.output_file_id
        if fid is None:
            return
        for _, line in self.store.iter_file_lines(fid):
            yield line

    def batch_results(self, batch_id: str, *, errors: bool = False) -> Iterator[dict[str, Any]]:
        """The output (or error) lines of an ended batch as dicts, in input order."""
        for line in self.batch_file_lines(batch_id, errors=errors):
            yield orjson.loads(line)

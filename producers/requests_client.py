"""Publishing requests and following them to their end: what `Client.submit`, `stream`,
`wait` and the cancels do.

    requests = RequestsClient(settings, ResultsClient(settings))
    rid = requests.submit("Hello", SamplingParams(max_tokens=32, temperature=0))
    for event in requests.stream(rid): ...  # TokenEvent..., then FinalEvent | ErrorEvent
    requests.wait(rid, timeout=60)          # the stored Result once it is final

The request_id is the idempotency key and the Kafka key (so all events of a request sit
in one results partition). A request goes to its model's topics (producers/models_client.py:
no `model` = the default model's, today's names); priority >= PRIORITY_BATCH goes to the
batch topic of its model. Streams and
waits follow requests through one results reader (producers/results_reader.py, started at
the first of them, or a shared one given); the store (producers/results_client.py) gives
a request's submit time when it was not submitted here, and the state a wait returns.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError
from kafka.producer.future import FutureRecordMetadata
from pydantic import ValidationError

from inflight.schemas import (PRIORITY_BATCH, PRIORITY_INTERACTIVE, ErrorEvent, FinalEvent,
                              InferenceRequest, SamplingParams, SchemaError, Settings,
                              TokenEvent, encode)
from inflight.schemas.cancel import batch_cancel, request_cancel
from inflight.schemas.codec import schema_error
from inflight.schemas.embeddings import decode_vector
from inflight.schemas.errors import BrokerError, CapacityError, InflightError
from inflight.schemas.headers import (TRACEPARENT, TRACESTATE, Headers, get_header, header_key,
                                      header_value, message_headers, new_traceparent)
from inflight.transport import tracing
from inflight.transport.kafka_clients import producer

from inflight.producers.models_client import ModelsClient
from inflight.producers.results_client import NOT_FOUND, RequestNotFound, Result, ResultsClient
from inflight.producers.results_reader import ResultsReader

class EmbedError(InflightError, ValueError):
    """An input given to `Client.embed` was not embedded (the message names its index)."""


STREAM_CLOCK_SLACK_S = 5.0   # a submit time of another process: this much earlier (clock skew)
STREAM_LOOKBACK_S = 3600.0   # unknown submit time: look back this far
MAX_FOLLOWS = 10_000         # requests one client streams or waits on at once
WAIT_STORE_EVERY_S = 2.0     # wait: the store is asked this often meanwhile


def build_request(item: Any, params: SamplingParams | Mapping | None = None, *,
             request_id: str | None = None, priority: int | None = None,
             metadata: Mapping | None = None, batch_id: str | None = None,
             tools: list | None = None, tool_choice: Any = None,
             model: str | None = None, tenant: str | None = None,
             timeout: float | None = None, deadline: float | None = None,
             reply_to: str | None = None) -> InferenceRequest:
    """One InferenceRequest from what submit accepts (a prompt, chat messages, token ids, a
    dict of request fields or an InferenceRequest); SchemaError names the first bad field."""
    if isinstance(item, InferenceRequest):
        if tenant is not None and item.tenant is None:
            item = item.model_copy(update={"tenant": tenant})
        return item if model is None else item.model_copy(update={"model": model})
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
    if model is not None:
        fields["model"] = model
    for name, value in (("tenant", tenant), ("timeout", timeout), ("deadline", deadline)):
        if value is not None:
            fields.setdefault(name, value)
    if reply_to is not None:
        fields["reply_to"] = reply_to
    fields.setdefault("submitted_at", time.time())
    try:
        return InferenceRequest.model_validate(fields)
    except ValidationError as exc:  # one SchemaError naming the first bad field
        raise schema_error(exc, raw=None, request_id=fields.get("request_id"),
                           model=InferenceRequest) from None


def request_headers(req: InferenceRequest, extra: Headers | None = None) -> Headers:
    """The record headers of a request (schemas/headers.py): content-type, schema-version,
    its id and tenant, then `extra` as given; a `traceparent` is started when `extra` has
    none (the request's own trace: every event of it carries the same one)."""
    out = message_headers(req.request_id, _tenant(req))
    extra = [(header_key(k), header_value(v)) for k, v in (extra or ())]
    if get_header(extra, TRACEPARENT) is None:
        extra.append((TRACEPARENT, new_traceparent()))
    return out + [(k, v) for k, v in extra if k not in dict(out)]


def _tenant(req: InferenceRequest) -> str | None:
    tenant = getattr(req, "tenant", None)  # the wire's tenant field, where it exists
    return tenant if isinstance(tenant, str) else None


class RequestsClient:
    """The Kafka side of a client: a producer for requests and cancels, a results reader
    for streams and waits (see the module doc)."""

    def __init__(self, settings: Settings, results: ResultsClient, *,
                 reader: ResultsReader | None = None, max_follows: int = MAX_FOLLOWS,
                 models: ModelsClient | None = None):
        """`reader`: a results reader to share (the API's); by default one is started at
        the first stream or wait (one per client, whatever it follows). `models`: where
        requests are routed by model (by default one of its own)."""
        self.settings = settings
        self.results = results
        self.models = models or ModelsClient(settings)
        self.max_follows = max_follows
        self._producer: KafkaProducer | None = None
        self._submitted: dict[str, float] = {}
        self._reader = reader
        self._own_reader = reader is None
        self.tracer = tracing.tracer(settings, "inflight.client")  # None: tracing is off

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
    def reader(self) -> ResultsReader:
        """The one reader of the results topics that stream and wait share."""
        if self._reader is None:
            self._reader = ResultsReader(self.settings, max_follows=self.max_follows,
                                         name="client").start()
        return self._reader

    def close(self) -> None:
        self.models.close()
        if self._reader is not None and self._own_reader:
            self._reader.close()
            self._reader = None
        if self._producer is not None:
            self._producer.flush()
            self._producer.close()
            self._producer = None

    # -- submit -----------------------------------------------------------------------------
    def topic_for(self, req: InferenceRequest) -> str:
        """The request topic of the request's model (its batch topic from PRIORITY_BATCH)."""
        return self.models.topics(req.model).for_priority(req.priority >= PRIORITY_BATCH)

    def routed(self, req: InferenceRequest,
               allow_unserved: bool = False) -> tuple[InferenceRequest, str]:
        """The request as its model's workers read it (the default model named by any of
        its names carries no `model`) and its topic; ModelNotFoundError for a model no
        live worker serves, unless `allow_unserved`."""
        route = self.models.route(req.model, allow_unserved=allow_unserved)
        if route.model != req.model:
            req = req.model_copy(update={"model": route.model})
        return req, route.topic(req.priority >= PRIORITY_BATCH)

    def submit(self, prompt: Any = None, params: SamplingParams | Mapping | None = None, *,
               messages: list | None = None, request_id: str | None = None,
               priority: int = PRIORITY_INTERACTIVE, metadata: Mapping | None = None,
               batch_id: str | None = None, flush: bool = True, tools: list | None = None,
               tool_choice: Any = None, model: str | None = None,
               allow_unserved: bool = False, headers: Headers | None = None,
               tenant: str | None = None, timeout: float | None = None,
               deadline: float | None = None, reply_to: str | None = None) -> str:
        """Publish one request; returns its request_id (a given one is kept).
        `params` may constrain the output (`{"structured_outputs": {"json": SCHEMA}}`, or
        SamplingParams(structured_outputs=...)); `tools` / `tool_choice` (OpenAI's, with
        `messages`) make the answer's tool calls come back on the result (`tool_calls`).
        `model`: the model to run it (None: the default model); a model no live worker
        serves is a ModelNotFoundError, unless `allow_unserved` (it waits in its topic for
        workers that start later). `headers`: extra record headers (`traceparent` /
        `tracestate` of the caller's trace; any other is copied onto the request's events).
        `tenant`: who it is for (default INFLIGHT_TENANT; fair share, usage); `timeout`
        (seconds) / `deadline` (epoch seconds): it ends `expired` when not done by then
        (docs/tenants.md). `reply_to`: a topic of yours that also gets its final event (and
        its deltas when it streams): docs/kafka-contract.md."""
        req = build_request(messages if messages is not None else prompt, params,
                            request_id=request_id, priority=priority, metadata=metadata,
                            batch_id=batch_id, tools=tools, tool_choice=tool_choice,
                            model=model, tenant=tenant or self.settings.tenant,
                            timeout=timeout, deadline=deadline, reply_to=reply_to)
        self._publish(*self.routed(req, allow_unserved), headers=headers)
        if flush:
            self.flush()
        return req.request_id

    def _publish(self, req: InferenceRequest, topic: str, headers: Headers | None = None) -> None:
        self.send(req, topic, headers=headers)
        self._submitted[req.request_id] = req.submitted_at

    def send(self, req: InferenceRequest, topic: str | None = None, *,
             headers: Headers | None = None, key: str | None = None) -> FutureRecordMetadata:
        """Publish one request (already routed: `routed`) to `topic` (None: its model's,
        `topic_for`) without flushing or remembering it (long-running servers); returns
        kafka-python's future, done when Kafka acknowledged the record. `headers`: extra
        record headers (a `traceparent` of the caller's trace; others are copied onto the
        request's events unchanged); see `request_headers`. `key`: the record's key (None:
        the request id; siblings of one `n` > 1 request share their parent's, so they land
        on one partition and one worker, which computes their prompt once)."""
        value = encode(req)
        if len(value) > self.settings.kafka_max_message_bytes:
            raise SchemaError(f"request {req.request_id} is {len(value)} bytes, over the limit "
                              f"of {self.settings.kafka_max_message_bytes} "
                              "(INFLIGHT_KAFKA_MAX_MESSAGE_BYTES); shorten the prompt",
                              request_id=req.request_id, code="message_too_large")
        topic = topic or self.topic_for(req)
        if self.tracer is not None:
            return self._send_traced(req, topic, value, headers, key)
        if headers is None:  # serving an HTTP caller that sent its trace context (the API)
            headers = tracing.caller_context()
        return self._send(req, topic, value, request_headers(req, headers), key)

    def _send(self, req: InferenceRequest, topic: str, value: bytes,
              headers: Headers, key: str | None = None) -> FutureRecordMetadata:
        try:
            return self.producer.send(topic, key=(key or req.request_id).encode(), value=value,
                                      headers=headers)
        except KafkaError as exc:
            raise BrokerError(f"publishing {req.request_id} failed: {exc}") from exc

    def _send_traced(self, req: InferenceRequest, topic: str, value: bytes,
                     headers: Headers | None, key: str | None = None) -> FutureRecordMetadata:
        """send() with tracing on: an `inflight.submit` span, a child of the caller's
        traceparent header (else of the current span: the API's request), whose context
        becomes the request's traceparent (transport/tracing.py)."""
        from opentelemetry.trace import SpanKind

        given = [(header_key(k), header_value(v)) for k, v in (headers or ())]
        parent = tracing.context_from(given) if get_header(given, TRACEPARENT) else None
        with self.tracer.start_as_current_span(
                "inflight.submit", context=parent, kind=SpanKind.PRODUCER,
                attributes={"messaging.system": "kafka", "messaging.destination.name": topic,
                            "messaging.operation.type": "send",
                            "inflight.request_id": req.request_id}):
            own = [(k, v) for k, v in given if k not in (TRACEPARENT, TRACESTATE)]
            return self._send(req, topic, value, request_headers(req, own + tracing.inject()), key)

    def flush(self, timeout: float | None = 30) -> None:
        if self._producer is not None:
            try:
                self._producer.flush(timeout=timeout)
            except KafkaError as exc:
                raise BrokerError(f"the broker did not acknowledge the requests: {exc}") from exc

    def submit_many(self, items: Iterable[Any], params: SamplingParams | Mapping | None = None, *,
                    priority: int | None = None, batch_id: str | None = None,
                    progress: bool | None = None, flush_every: int = 1000,
                    model: str | None = None, allow_unserved: bool = False,
                    tenant: str | None = None) -> list[str]:
        """Publish many requests (strings, messages, dicts of request fields or
        InferenceRequests); a progress bar shows on long inputs. Returns the ids in order.
        `model`: for items that name none; each request goes to its own model's topics (a
        model nobody serves: ModelNotFoundError before anything more is sent, unless
        `allow_unserved`)."""
        from tqdm import tqdm

        total = len(items) if hasattr(items, "__len__") else None  # type: ignore[arg-type]
        show = progress if progress is not None else (total is None or total >= 200)
        ids = []
        with tqdm(total=total, disable=not show, unit="req", desc="submit") as bar:
            for item in items:
                req = build_request(item, params, priority=priority, batch_id=batch_id,
                                    tenant=tenant or self.settings.tenant)
                if model is not None and req.model is None:
                    req = req.model_copy(update={"model": model})
                self._publish(*self.routed(req, allow_unserved))
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
                self.producer.send(self.settings.topic_cancel, key=key, value=value,
                                   headers=message_headers(rid))
                n += 1
        except KafkaError as exc:
            raise BrokerError(f"publishing cancels failed: {exc}") from exc
        self.flush()
        return n

    def lora_command(self, action: str, lora_name: str, lora_path: str | None = None,
                     model: str | None = None) -> None:
        """Tell the workers of `model` (None: every worker) to load or unload a LoRA
        adapter (schemas/lora.py), on the control topic; waits for the broker's
        acknowledgement. ValueError naming a malformed field."""
        from inflight.schemas.lora import LoraCommand, check_lora_command, lora_command

        key, value = lora_command(check_lora_command(LoraCommand(action, lora_name, lora_path, model)))
        try:
            self.producer.send(self.settings.topic_cancel, key=key, value=value)
        except KafkaError as exc:
            raise BrokerError(f"publishing the LoRA {action} of {lora_name!r} failed: {exc}") from exc
        self.flush()

    def cancel_batch_requests(self, batch_id: str) -> None:
        """One cancel for every request of the batch (the queued ones end `cancelled`
        without running), then wait for the broker's acknowledgement. `cancel_batch` moves
        the batch itself to `cancelling` and sends this."""
        key, value = batch_cancel(batch_id)
        try:
            self.producer.send(self.settings.topic_cancel, key=key, value=value,
                               headers=message_headers())
        except KafkaError as exc:
            raise BrokerError(f"publishing the cancel of batch {batch_id} failed: {exc}") from exc
        self.flush()

    def publish_encoded(self, items: Iterable[tuple[str, bytes]], *, topic: str) -> int:
        """Send already-encoded requests (request_id, bytes) to `topic` and flush (the batch
        enqueue task: it encoded and size-checked them while validating), or batch events (the
        batch-events topic: content-type and schema-version headers only, no request id or
        trace)."""
        n = 0
        requests = topic != getattr(self.settings, "topic_batch_events", None)
        try:
            for rid, value in items:
                headers = (message_headers(rid) + [(TRACEPARENT, new_traceparent())]
                           if requests else message_headers())
                self.producer.send(topic, key=rid.encode(), value=value, headers=headers)
                n += 1
        except KafkaError as exc:
            raise BrokerError(f"publishing to {topic} failed: {exc}") from exc
        self.flush()
        return n

    def embed(self, texts: Any, *, model: str | None = None, dimensions: int | None = None,
              timeout: float = 120.0, chunk: int = 1000,
              allow_unserved: bool = False) -> list[list[float]]:
        """Embed texts (or token-id lists; one text alone is a list of one) on an embedding
        model's workers; returns one float vector per input, in order. Each input is one
        Kafka request of kind "embed"; their final events carry the vectors. EmbedError
        names the first input that failed (with the worker's reason); RequestNotFound when
        an answer does not come within `timeout` seconds. At most `chunk` inputs are in
        flight at once."""
        items = [texts] if isinstance(texts, str) else list(texts)
        out: list[list[float]] = []
        for lo in range(0, len(items), chunk):
            out += self._embed_chunk(items[lo:lo + chunk], lo, model, dimensions, timeout,
                                     allow_unserved)
        return out

    def _embed_chunk(self, items: list, first: int, model: str | None, dimensions: int | None,
                     timeout: float, allow_unserved: bool) -> list[list[float]]:
        reqs = []
        for i, item in enumerate(items, first):
            field = "prompt" if isinstance(item, str) else "prompt_token_ids"
            try:
                req = build_request({field: item, "kind": "embed", "dimensions": dimensions,
                                     "stream": False}, model=model)
            except SchemaError as exc:
                raise EmbedError(f"input {i}: {exc}") from None
            reqs.append(self.routed(req, allow_unserved))
        deadline = time.monotonic() + timeout
        with contextlib.ExitStack() as stack:
            # followed first (since=None: published after this call), so no event is missed
            follows = [stack.enter_context(self.reader.follow(req.request_id)) for req, _ in reqs]
            for req, topic in reqs:
                self.send(req, topic)
            self.flush()
            vectors = []
            for i, ((req, _), f) in enumerate(zip(reqs, follows), first):
                final = None
                for event in f.events(deadline, lambda rid=req.request_id: RequestNotFound(
                        f"no answer for input {i} (request {rid}) within {timeout:.0f}s; "
                        "is an embedding worker running? (`inflight models`)")):
                    final = event
                if isinstance(final, ErrorEvent):
                    raise EmbedError(f"input {i}: {final.message} ({final.code})")
                if final is None or final.embedding is None:
                    raise EmbedError(f"input {i}: the worker answered without a vector (is "
                                     f"{req.model or 'the default model'} an embedding model?)")
                vectors.append(decode_vector(final.embedding))
        return vectors

    # -- following -----------------------------------------------------------------------------
    def wait(self, request_id: str, timeout: float | None = None, poll_s: float = 0.1) -> Result:
        """Wait until the request is final in the store or `timeout` seconds pass; returns
        the last state seen (check `.done`). A known request is waited on through the
        results reader (its final event, then the recorder's row); meanwhile the store is
        asked every WAIT_STORE_EVERY_S (a row ended by the store alone ends the wait)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        res = self.results.result(request_id)
        if res.done or (deadline is not None and time.monotonic() >= deadline):
            return res
        if res.found or request_id in self._submitted:
            self._await_final(request_id, deadline)
        while True:
            res = self.results.result(request_id)
            if res.done or (deadline is not None and time.monotonic() >= deadline):
                return res
            time.sleep(poll_s)

    def _await_final(self, request_id: str, deadline: float | None) -> None:
        """Until the request's final event is read, its row is final (a batch's cancel
        grace ends rows without an event; the store is asked every WAIT_STORE_EVERY_S) or
        the deadline passes; quietly returns if the results topics cannot be read (the
        store is polled instead)."""
        try:
            with self.reader.follow(request_id, since=self._since(request_id)) as f:
                while not f.finished:
                    until = time.monotonic() + WAIT_STORE_EVERY_S
                    if deadline is not None:
                        until = min(until, deadline)
                    try:
                        f.get(until)
                    except TimeoutError:
                        if (deadline is not None and time.monotonic() >= deadline) or \
                                self.results.result(request_id).done:
                            return
        except (BrokerError, CapacityError):
            pass

    def _since(self, request_id: str, since: float | None = None) -> float:
        """An instant before which no event of the request was appended (this host's
        clock): its submit time if this client submitted it; a time from elsewhere (the
        store's, a caller's) STREAM_CLOCK_SLACK_S earlier; unknown: STREAM_LOOKBACK_S back."""
        if since is not None:
            return since - STREAM_CLOCK_SLACK_S
        if request_id in self._submitted:
            return self._submitted[request_id]
        try:
            res = self.results.result(request_id)
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

        Follows the request through the client's one results reader (no consumer of its
        own), replaying from the submit time (`since`, else this client's or the store's;
        the reader finds the offsets from its checkpoints or `offsets_for_times`, never
        "latest"), so a stream started after the request finished still returns its whole
        text. Raises RequestNotFound when no final event shows up within `timeout` seconds.
        """
        start = self._since(request_id, since)
        deadline = time.monotonic() + timeout
        with self.reader.follow(request_id, since=start) as f:
            yield from f.events(deadline, lambda: RequestNotFound(
                self._not_found_message(request_id, timeout)))

    def _not_found_message(self, request_id: str, timeout: float) -> str:
        res = self.results.result(request_id)
        if res.found:
            return (f"request {request_id} is {res.status} but no final event arrived within "
                    f"{timeout:.0f}s; is a worker running? (`inflight worker`)")
        return (f"request {request_id} not found: nothing in the store and no events on "
                f"{self.settings.topic_results} within {timeout:.0f}s")

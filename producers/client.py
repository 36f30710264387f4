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

Many models: `client.submit(..., model="gemma-3-270m")` goes to that model's topics;
`client.models()` lists the models with live workers (the registry); a model nobody serves
is a ModelNotFoundError (`allow_unserved=True` submits it anyway, for workers to come).

`Client` is a facade over four clients, one per job, each usable alone:

    requests_client  RequestsClient (producers/requests_client.py): submit, submit_many,
                     send, flush, cancel, cancel_many, cancel_batch_requests,
                     publish_encoded, topic_for, routed, stream, wait (Kafka both ways)
    models_client    ModelsClient (producers/models_client.py): models, route (the registry)
    results_client   ResultsClient (producers/results_client.py): result, wait_many (the store)
    batches_client   BatchesClient (producers/batches_client.py): upload_file, create_batch,
                     get_batch, list_batches, cancel_batch, wait_batch, batch_file_lines,
                     batch_results (files, Celery)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from inflight.schemas import Settings
from inflight.store import Store
from inflight.transport.partitioner import partition_for

from inflight.producers.batches_client import BatchesClient
from inflight.producers.models_client import ModelsClient, Route, ServedModel
from inflight.producers.requests_client import (MAX_FOLLOWS, STREAM_CLOCK_SLACK_S,
                                                STREAM_LOOKBACK_S, RequestsClient, build_request)
from inflight.producers.results_client import NOT_FOUND, RequestNotFound, Result, ResultsClient
from inflight.producers.results_reader import ResultsReader

if TYPE_CHECKING:
    from celery import Celery
    from kafka import KafkaProducer

    from inflight.transport.registry_reader import RegistryReader

__all__ = ["Client", "Result", "RequestNotFound", "NOT_FOUND", "partition_for", "build_request",
           "STREAM_CLOCK_SLACK_S", "STREAM_LOOKBACK_S", "MAX_FOLLOWS", "ServedModel", "Route"]


def _by(part: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """`Client.<name>`: the method of that name of the part client `part`, with its
    signature and docstring (functools.wraps)."""
    name = method.__name__

    @functools.wraps(method)
    def delegate(self: Client, *args: Any, **kwargs: Any) -> Any:
        return getattr(getattr(self, part), name)(*args, **kwargs)

    delegate.__qualname__ = f"Client.{name}"
    return delegate


class Client:
    def __init__(self, settings: Settings | None = None, *, store: Store | None = None,
                 results: ResultsReader | None = None, max_follows: int = MAX_FOLLOWS,
                 registry: RegistryReader | None = None, registry_wait_s: float | None = None,
                 default_context: int | None = None):
        """`store`: the store to read (closed with the Client); `results`: a results reader
        to share (the API's); by default the Client starts its own at the first stream or
        wait (one per Client, whatever it follows). `registry`: a registry reader to share
        (by default one starts at the first named model or models() call); `registry_wait_s`:
        how long a call waits for it to be read the first time (ModelsClient)."""
        self.settings = settings or Settings()
        self.max_follows = max_follows
        self.results_client = ResultsClient(self.settings, store)
        self.models_client = ModelsClient(
            self.settings, registry, default_context=default_context,
            **({} if registry_wait_s is None else {"wait_s": registry_wait_s}))
        self.requests_client = RequestsClient(self.settings, self.results_client, reader=results,
                                              max_follows=max_follows, models=self.models_client)
        self.batches_client = BatchesClient(self.settings, lambda: self.results_client.store,
                                            self.requests_client)

    # -- connections ----------------------------------------------------------------------
    @property
    def producer(self) -> KafkaProducer:
        return self.requests_client.producer

    @property
    def results(self) -> ResultsReader:
        """The one reader of the results topics that Client.stream and Client.wait share."""
        return self.requests_client.reader

    @property
    def store(self) -> Store:
        return self.results_client.store

    @property
    def celery(self) -> Celery:
        return self.batches_client.celery

    def close(self) -> None:
        self.requests_client.close()
        self.results_client.close()
        self.batches_client.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- submit and stream (RequestsClient) ---------------------------------------------------
    topic_for = _by("requests_client", RequestsClient.topic_for)
    routed = _by("requests_client", RequestsClient.routed)
    submit = _by("requests_client", RequestsClient.submit)
    send = _by("requests_client", RequestsClient.send)
    flush = _by("requests_client", RequestsClient.flush)
    submit_many = _by("requests_client", RequestsClient.submit_many)
    cancel = _by("requests_client", RequestsClient.cancel)
    cancel_many = _by("requests_client", RequestsClient.cancel_many)
    cancel_batch_requests = _by("requests_client", RequestsClient.cancel_batch_requests)
    lora_command = _by("requests_client", RequestsClient.lora_command)
    publish_encoded = _by("requests_client", RequestsClient.publish_encoded)
    stream = _by("requests_client", RequestsClient.stream)
    wait = _by("requests_client", RequestsClient.wait)
    embed = _by("requests_client", RequestsClient.embed)

    # -- the models served now (ModelsClient) ---------------------------------------------------
    models = _by("models_client", ModelsClient.models)
    route = _by("models_client", ModelsClient.route)

    # -- results from the store (ResultsClient) -----------------------------------------------
    result = _by("results_client", ResultsClient.result)
    wait_many = _by("results_client", ResultsClient.wait_many)

    # -- batch jobs (BatchesClient; see producers.batch_jobs) ----------------------------------
    upload_file = _by("batches_client", BatchesClient.upload_file)
    create_batch = _by("batches_client", BatchesClient.create_batch)
    get_batch = _by("batches_client", BatchesClient.get_batch)
    list_batches = _by("batches_client", BatchesClient.list_batches)
    cancel_batch = _by("batches_client", BatchesClient.cancel_batch)
    wait_batch = _by("batches_client", BatchesClient.wait_batch)
    batch_file_lines = _by("batches_client", BatchesClient.batch_file_lines)
    batch_results = _by("batches_client", BatchesClient.batch_results)

"""Producers: the client that publishes requests and reads results (and the CLI on top).

    from inflight.producers import Client

`Client` is a facade over one client per job (RequestsClient: submit, stream, wait, cancel;
ResultsClient: the store's results; BatchesClient: files and batch jobs).
"""

from inflight.producers.batches_client import BatchesClient
from inflight.producers.client import NOT_FOUND, Client, RequestNotFound, Result, partition_for
from inflight.producers.requests_client import RequestsClient
from inflight.producers.results_client import ResultsClient

__all__ = ["Client", "Result", "RequestNotFound", "NOT_FOUND", "partition_for",
           "RequestsClient", "ResultsClient", "BatchesClient"]

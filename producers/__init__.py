"""Producers: the client that publishes requests and reads results (and the CLI on top).

    from inflight.producers import Client
"""

from inflight.producers.client import NOT_FOUND, Client, RequestNotFound, Result, partition_for

__all__ = ["Client", "Result", "RequestNotFound", "NOT_FOUND", "partition_for"]

"""What every CLI command shares: printing a result (a human line, or JSON with --json)
and opening the client or the store the way the CLI does (quiet Alembic: the embedded
SQLite migrates itself on first use)."""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson

from inflight.schemas import Settings


def out(args: Any, human: str, data: Any) -> None:
    if getattr(args, "json", False):
        sys.stdout.write(orjson.dumps(data).decode() + "\n")
    else:
        print(human)
    sys.stdout.flush()


def client(settings: Settings) -> Any:
    from inflight.producers.client import Client

    logging.getLogger("alembic").setLevel(logging.WARNING)
    return Client(settings)


def store(settings: Settings) -> Any:
    from inflight.store import Store

    logging.getLogger("alembic").setLevel(logging.WARNING)
    return Store.embedded(settings.database_url, files_url=settings.files_url,
                          files_endpoint=settings.files_s3_endpoint)

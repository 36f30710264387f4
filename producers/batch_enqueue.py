"""Validate and enqueue one batch (the Celery enqueue task runs `validate_and_enqueue`).

Pass 1 checks every line (producers.batch_lines) and spools each request, already encoded,
to a temporary file; any bad line fails the batch and nothing is published. Pass 2 reads
the spool back and publishes in chunks, each request to its model's batch topic (a file may
mix models). A task that resumes a half-published batch (after a crash) has no spool: it
parses the input again from the first unpublished request.
"""

from __future__ import annotations

import logging
import struct
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from operator import itemgetter
from typing import IO, Any

from inflight.schemas import PRIORITY_BATCH, SchemaError, encode
from inflight.schemas.anthropic_batch import MESSAGES_URL
from inflight.schemas.errors import NotFoundError, Retry
from inflight.store import CANCELLED, CANCELLING, FAILED, IN_PROGRESS, QUEUED, VALIDATING, BatchRow
from inflight.store.models import utcnow
from inflight.store.limits import owner_queued_token_limit, owner_queued_tokens

from inflight.producers.batch_context import JobContext, dispatch_marker, end_requests, expired
from inflight.producers.batch_lines import LineChecker, LineError, LineModel, model_lookup
from inflight.producers.batch_output import write_refused_messages

log = logging.getLogger("inflight.batch")

MAX_RECORDED_ERRORS = 1000   # line errors kept in the batch row (the count is exact)
PROGRESS_EVERY = 5000        # validated lines between progress updates
# spool record: len(request_id), len(custom_id), len(value), its LineModel's index
_REC = struct.Struct("<HHIH")

Chunk = list[tuple[str, str, bytes, LineModel]]  # (request_id, custom_id, encoded, its model)


def validate_and_enqueue(ctx: JobContext, batch_id: str) -> str:
    """Check every line of the batch's input; a bad line fails the batch (nothing is
    published), else publish every request (resuming after `lines_enqueued`). Returns what
    happened ("failed", "enqueued", "stopped", "nothing to do"). Raises Retry when another
    task holds the batch."""
    store = ctx.store
    b = store.get_batch(batch_id)
    if b is None:
        raise NotFoundError(f"batch {batch_id!r} not found")
    if b.status not in (VALIDATING, IN_PROGRESS) or (
            b.status == IN_PROGRESS and b.lines_enqueued >= b.request_total):
        return "nothing to do"
    owner = f"enqueue:{ctx.worker}:{uuid.uuid4().hex[:8]}"
    if not store.claim_batch(batch_id, owner, ctx.settings.batch_lease_s,
                             or_owner=dispatch_marker(batch_id)):
        raise Retry(f"batch {batch_id} is being worked on by another task", delay=5.0)
    # the spool: pass 1's encoded requests, on disk (memory stays flat), read by pass 2
    with tempfile.TemporaryFile(prefix=f"inflight-{batch_id[-12:]}-") as spool:
        try:
            if b.status == VALIDATING:
                routes: list[LineModel] = []
                outcome = _validate(ctx, b, owner, spool, routes)
                if outcome != IN_PROGRESS:
                    return outcome
                b = store.require_batch(batch_id)
                spool.seek(0)
                return _enqueue(ctx, b, owner, _spooled(spool, ctx.settings.batch_enqueue_chunk,
                                                        routes))
            return _enqueue(ctx, b, owner, _parsed(ctx, b))
        finally:
            store.release_batch(batch_id, owner)


def _checker(ctx: JobContext, b: BatchRow) -> LineChecker:
    s = ctx.settings
    return LineChecker(b.id, b.endpoint or "", context=ctx.context_length,
                       max_prompt_chars=s.max_prompt_chars,
                       max_line_bytes=s.kafka_max_message_bytes,
                       models=model_lookup(ctx.models) if ctx.models is not None else None,
                       one_model=s.batch_one_model_per_file,
                       default_topic=s.topic_requests_batch, tenant=b.owner,
                       deadline=b.expires_at.timestamp() if b.expires_at is not None else None)


def _validate(ctx: JobContext, b: BatchRow, owner: str, spool: IO[bytes],
              routes: list[LineModel]) -> str:
    """Pass 1; `routes` gets the line models the spool records index."""
    store, s = ctx.store, ctx.settings
    checker = _checker(ctx, b)
    index: dict[LineModel, int] = {}
    errors: list[dict[str, Any]] = []
    n_bad = n_ok = n_lines = n_tokens = 0
    t0 = time.monotonic()
    for no, raw in store.iter_file_lines(b.input_file_id):  # type: ignore[arg-type]
        n_lines = no
        if raw.strip():
            try:
                cid, req = checker.check(no, raw)
                value = encode(req)
                size = len(value)
                if size > s.kafka_max_message_bytes:
                    raise SchemaError(f"line {no}: the request is {size} bytes encoded, over "
                                      f"the limit of {s.kafka_max_message_bytes} "
                                      "(INFLIGHT_KAFKA_MAX_MESSAGE_BYTES); shorten it",
                                      code="message_too_large")
                if not n_bad:  # once a line is bad nothing is published: stop spooling
                    rid, cid_b = req.request_id.encode(), cid.encode()
                    route = checker.route_of(req)
                    at = index.get(route)
                    if at is None:
                        at = index[route] = len(routes)
                        routes.append(route)
                    spool.write(_REC.pack(len(rid), len(cid_b), size, at) + rid + cid_b + value)
                n_ok += 1
                n_tokens += req.token_estimate
            except SchemaError as e:
                n_bad += 1
                if len(errors) < MAX_RECORDED_ERRORS:
                    errors.append(LineError(no, e.message, e.code, e.field).to_json())
            except (ValueError, TypeError, UnicodeError, OverflowError) as e:
                # a line the checks let through and the encoder refused: it fails here, with
                # its number, not later in a loop that serves every batch
                n_bad += 1
                if len(errors) < MAX_RECORDED_ERRORS:
                    errors.append(LineError(no, f"line {no}: cannot be encoded "
                                            f"({type(e).__name__}: {e})").to_json())
        if no % PROGRESS_EVERY == 0:
            if not store.set_batch_fields(b.id, only_if_status=[VALIDATING], lines_validated=no):
                return "stopped"  # cancelled meanwhile
            if expired(b) or not store.claim_batch(b.id, owner, s.batch_lease_s):
                return "stopped"
    if n_bad > len(errors):
        errors.append({"code": "too_many_errors", "message": f"{n_bad} bad lines in all; the "
                       f"first {len(errors)} are listed", "param": None, "line": None})
    if not n_ok and not n_bad:
        errors.append({"code": "empty_file", "message": "the input file has no requests; "
                       "give one JSON line per request", "param": None, "line": None})
    if not errors:
        over = _over_queued_token_limit(store, b, n_tokens)
        if over is not None:
            errors.append(over)
    if errors:
        results: dict[str, Any] = {}
        if b.endpoint == MESSAGES_URL:  # Anthropic's batches report bad requests per request
            fid, n = write_refused_messages(store, b, {e["line"]: e["message"] for e in errors
                                                       if e["line"] is not None})
            results = {"output_file_id": fid, "request_total": n, "request_failed": n}
        if not store.transition_batch(b.id, FAILED, lease_owner=owner, errors=errors,
                                      lines_validated=n_lines, **results):
            if results.get("output_file_id"):
                store.delete_file(results["output_file_id"])
        log.info("batch %s failed validation: %d bad of %d lines (%.1fs)", b.id, n_bad,
                 n_lines, time.monotonic() - t0)
        return FAILED
    if not store.transition_batch(b.id, IN_PROGRESS, lease_owner=owner, request_total=n_ok,
                                  lines_validated=n_lines, queued_tokens=n_tokens):
        return "stopped"
    log.info("batch %s validated: %d requests in %.1fs", b.id, n_ok, time.monotonic() - t0)
    return IN_PROGRESS


def _over_queued_token_limit(store: Any, b: BatchRow, tokens: int) -> dict[str, Any] | None:
    """The batch error when `tokens` more would take its owner past its queued-token limit
    (the smallest max_queued_tokens of the owner's live keys; OpenAI's enqueued-token
    limit), else None. Counted over the owner's batches that are not final."""
    limit = owner_queued_token_limit(store, b.owner)
    if limit is None:
        return None
    queued = owner_queued_tokens(store, b.owner, exclude=b.id)
    if queued + tokens <= limit:
        return None
    return {"code": "token_limit_exceeded", "param": None, "line": None,
            "message": f"Enqueued token limit reached for owner {b.owner}: this batch needs "
                       f"{tokens:,} tokens (prompts + max_tokens), the owner's batches not yet "
                       f"done hold {queued:,}, and the limit is {limit:,} "
                       "(max_queued_tokens of its API keys). Submit a smaller batch or wait "
                       "until the current batches complete."}


def _spooled(spool: IO[bytes], size: int, routes: list[LineModel]) -> Iterator[Chunk]:
    """Chunks of the requests pass 1 spooled, in input order (`routes`: their models).

    NOTE: their submitted_at is the validation time (they were encoded then), seconds
    before they are published; batch requests are not streamed, so nothing seeks by it."""
    chunk: Chunk = []
    while head := spool.read(_REC.size):
        n_rid, n_cid, n_val, at = _REC.unpack(head)
        body = spool.read(n_rid + n_cid + n_val)
        chunk.append((body[:n_rid].decode(), body[n_rid:n_rid + n_cid].decode(),
                      body[n_rid + n_cid:], routes[at]))
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _parsed(ctx: JobContext, b: BatchRow) -> Iterator[Chunk]:
    """Chunks of the requests not published yet, parsed again from the input file (a task
    resuming after a crash has no spool), in input order."""
    checker = _checker(ctx, b)
    skip = b.lines_enqueued  # requests published by an earlier run of this task
    chunk: Chunk = []
    for no, raw in ctx.store.iter_file_lines(b.input_file_id):  # type: ignore[arg-type]
        if not raw.strip():
            continue
        if skip:
            skip -= 1
            continue
        # validated already: cannot fail on the same bytes (a model whose workers all
        # stopped meanwhile fails the line; the task fails the batch saying so)
        cid, req = checker.check(no, raw)
        chunk.append((req.request_id, cid,
                      encode(req.model_copy(update={"submitted_at": time.time()})),
                      checker.route_of(req)))
        if len(chunk) >= ctx.settings.batch_enqueue_chunk:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _enqueue(ctx: JobContext, b: BatchRow, owner: str, chunks: Iterator[Chunk]) -> str:
    """Publish the batch's requests, a chunk at a time, three stages overlapped:

        main thread:   parse chunk k+1 ─┐          check status ─► publish chunk k+1 ...
        db thread:                      └► insert rows k+1 ─┘
        send thread:   publish chunk k (send + wait for the broker's acks) ─► progress k

    NOTE (the order that matters, per chunk): its rows are inserted, THEN the status and
    lease are checked, THEN it is published, THEN `lines_enqueued` moves past it. So a
    published request always has a row that cancel_batch (which lists rows after moving
    the batch to `cancelling`) finds, and a retried task republishes at most the chunks
    whose acknowledgement it had not recorded."""
    store, s = ctx.store, ctx.settings
    done = b.lines_enqueued
    t0 = time.monotonic()
    rid_of = itemgetter(0)

    def insert(chunk: Chunk) -> None:
        now = utcnow()
        store.insert_requests([{"id": rid, "batch_id": b.id, "custom_id": cid,
                                "owner": b.owner, "tenant": b.owner, "status": QUEUED,
                                "priority": PRIORITY_BATCH, "model": route.name, "created_at": now}
                               for rid, cid, _, route in chunk])

    def publish(chunk: Chunk) -> int:
        by_topic: dict[str, list[tuple[str, bytes]]] = {}
        for rid, _, value, route in chunk:  # each to its model's batch topic, in order
            by_topic.setdefault(route.topic, []).append((rid, value))
        for topic, items in by_topic.items():
            ctx.publisher.publish_encoded(items, topic=topic)
        return len(chunk)

    def settle(sent: Future[int]) -> bool:
        nonlocal done
        done += sent.result()  # BrokerError propagates: the task is retried
        return store.set_batch_fields(b.id, only_if_status=[IN_PROGRESS], lines_enqueued=done)

    def abandon(chunk: Chunk) -> str:
        """Rows in, never published: if the batch is being cancelled they end `cancelled`
        now (an expired batch's open rows are ended by the sweep)."""
        cur = store.get_batch(b.id)
        if cur is not None and cur.status in (CANCELLING, CANCELLED):
            end_requests(store, list(map(rid_of, chunk)), b.id, CANCELLED)
        return "stopped"

    def may_publish() -> bool:
        cur = store.get_batch(b.id)
        return (cur is not None and cur.status == IN_PROGRESS and not expired(cur)
                and store.claim_batch(b.id, owner, s.batch_lease_s))

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"enqueue-{b.id[-6:]}") as pool:
        sending: Future[int] | None = None
        for chunk in chunks:
            inserting = pool.submit(insert, chunk)
            if sending is not None and not settle(sending):
                inserting.result()
                return abandon(chunk)
            sending = None
            inserting.result()
            if not may_publish():
                return abandon(chunk)
            sending = pool.submit(publish, chunk)
        if sending is not None and not settle(sending):
            return "stopped"
    log.info("batch %s: %d requests published in %.1fs", b.id, done - b.lines_enqueued,
             time.monotonic() - t0)
    return "enqueued"



"""Result lines of a batch: OpenAI Batch output/error lines, Anthropic Message Batches
result lines, written as files in the store by one pass over the input file.

OpenAI (endpoint /v1/chat/completions or /v1/completions): the output file holds one line
per completed request, the error file one per request that failed, was cancelled or
expired:

    {"id": "batch_req_…", "custom_id": "q1", "error": null,
     "response": {"status_code": 200, "request_id": "<our request id>",
                  "body": {chat.completion | text_completion object, with usage}}}
    {"id": "batch_req_…", "custom_id": "q2", "response": null,
     "error": {"code": "batch_expired", "message": "…"}}

Anthropic (/v1/messages): one results file, every line
`{"custom_id", "result": {"type": "succeeded" | "errored" | "canceled" | "expired", …}}`.

Lines follow the input file's order; a line whose request never reached the store
(the batch was cancelled or expired before it was published) is written as cancelled /
expired.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson

from inflight.schemas.anthropic_batch import MESSAGES_URL
from inflight.schemas.anthropic_message import message_object
from inflight.schemas.batch import CHAT_URL, EMBEDDINGS_URL
from inflight.schemas.embeddings import unpack_vector
from inflight.schemas.json_text import parse_json
from inflight.schemas.tools import parse_tool_calls
from inflight.store import BatchRow, Store
from inflight.store.models import CANCELLED, COMPLETED, EXPIRED, FAILED

from inflight.producers.batch_lines import request_id_for

log = logging.getLogger("inflight.batch")

PAGE = 1000  # input lines (and request rows fetched) per round trip

_EXPIRED_MSG = "This request could not be executed before the completion window expired."
_CANCELLED_MSG = "This request was cancelled before it completed."
_OPENAI_STOP = {"stop": "stop", "length": "length"}


def output_expiry(batch: BatchRow) -> datetime | None:
    """When the batch's output files expire (output_expires_after, anchored at created_at)."""
    if not batch.output_expires_after:
        return None
    return batch.created_at + timedelta(seconds=batch.output_expires_after)


def _hid(prefix: str, rid: str) -> str:
    return prefix + hashlib.sha256(rid.encode()).hexdigest()[:24]


def _created(row: dict[str, Any]) -> int:
    at = row.get("finished_at")
    return int(at.timestamp()) if at is not None else 0


def _usage(row: dict[str, Any]) -> tuple[int, int]:
    u = row.get("usage") or {}
    return int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0))


def _unfinished(row: dict[str, Any] | None, batch_status: str) -> str | None:
    """EXPIRED / CANCELLED for a request without a usable result, None for one that
    completed or failed."""
    status = row["status"] if row is not None else None
    if status in (COMPLETED, FAILED):
        return None
    if status in (EXPIRED, CANCELLED):
        return status
    # no final row: never published, or still queued/running when the batch ended
    return EXPIRED if batch_status == EXPIRED else CANCELLED


def calls_tools(body: Any, anthropic: bool) -> bool:
    """Whether a line's request could call its tools (its answer may hold call markup)."""
    if not isinstance(body, dict) or not body.get("tools"):
        return False
    choice = body.get("tool_choice")
    if anthropic:
        return not (isinstance(choice, dict) and choice.get("type") == "none")
    return choice != "none"


def openai_line(custom_id: str, rid: str, row: dict[str, Any] | None, *, endpoint: str,
                model: str, batch_status: str, tools: bool = False) -> tuple[dict[str, Any], bool]:
    """(output line, is_error) for one request in OpenAI's batch output format; `tools`:
    the request could call tools (calls_tools)."""
    line: dict[str, Any] = {"id": _hid("batch_req_", rid), "custom_id": custom_id}
    gone = _unfinished(row, batch_status)
    if gone is not None:
        code = "batch_expired" if gone == EXPIRED else "batch_cancelled"
        line.update(response=None,
                    error={"code": code, "message": _EXPIRED_MSG if gone == EXPIRED else _CANCELLED_MSG})
        return line, True
    assert row is not None
    if row["status"] == COMPLETED:
        p, c = _usage(row)
        usage = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
        finish = _OPENAI_STOP.get(row.get("finish_reason") or "stop", "stop")
        if endpoint == EMBEDDINGS_URL:  # OpenAI's embedding response, one input a line
            body = {"object": "list", "model": model,
                    "data": [{"object": "embedding", "index": 0,
                              "embedding": unpack_vector(row.get("embedding") or b"")}],
                    "usage": {"prompt_tokens": p, "total_tokens": p}}
        elif endpoint == CHAT_URL:
            message = {"role": "assistant", "content": row.get("output") or ""}
            tools = tools or bool(row.get("tool_calls"))
            if tools:  # content: the text outside the calls, no markup of a cut call
                message["content"] = parse_tool_calls(row.get("output") or "", rid,
                                                      cut=finish == "length")[0]
            if tools and row.get("tool_calls"):
                message["tool_calls"] = row["tool_calls"]
                finish = "tool_calls" if finish == "stop" else finish  # cut short: "length"
            body = {"id": _hid("chatcmpl-", rid), "object": "chat.completion",
                    "created": _created(row), "model": model,
                    "choices": [{"index": 0, "message": message,
                                 "logprobs": None, "finish_reason": finish}],
                    "usage": usage}
        else:
            body = {"id": _hid("cmpl-", rid), "object": "text_completion",
                    "created": _created(row), "model": model,
                    "choices": [{"index": 0, "text": row.get("output") or "", "logprobs": None,
                                 "finish_reason": finish}],
                    "usage": usage}
        line.update(response={"status_code": 200, "request_id": rid, "body": body}, error=None)
        return line, False
    code = row.get("error_code") or "engine_error"
    client_side = code in ("invalid_request", "invalid_schema", "prompt_too_long", "message_too_large")
    line.update(response={"status_code": 400 if client_side else 500, "request_id": rid,
                          "body": {"error": {"message": row.get("error") or "request failed",
                                             "type": "invalid_request_error" if client_side
                                             else "server_error",
                                             "param": None, "code": code}}},
                error=None)
    return line, True


def anthropic_line(custom_id: str, rid: str, row: dict[str, Any] | None, *, model: str,
                   batch_status: str, tools: bool = False) -> dict[str, Any]:
    """One Message Batches result line; `tools`: the request could call tools."""
    gone = _unfinished(row, batch_status)
    if gone is not None:
        return {"custom_id": custom_id,
                "result": {"type": "expired" if gone == EXPIRED else "canceled"}}
    assert row is not None
    if row["status"] == COMPLETED:
        p, c = _usage(row)
        message = message_object(rid, model, text=row.get("output") or "",
                                 finish_reason=row.get("finish_reason") or "stop",
                                 input_tokens=p, output_tokens=c,
                                 tools=tools or bool(row.get("tool_calls")))
        return {"custom_id": custom_id, "result": {"type": "succeeded", "message": message}}
    code = row.get("error_code") or "engine_error"
    kind = ("invalid_request_error" if code in ("invalid_request", "invalid_schema", "prompt_too_long",
                                                "message_too_large") else "api_error")
    return {"custom_id": custom_id,
            "result": {"type": "errored",
                       "error": {"type": "error", "error": {"type": kind,
                                                            "message": row.get("error") or code}}}}


def _unwritable(custom_id: str, rid: str, anthropic: bool,
                exc: BaseException) -> tuple[bytes, bool]:
    """(line, goes to the error file) for a request whose stored result could not be
    formatted: a failed result that says so."""
    message = (f"the stored result of this request could not be written ({type(exc).__name__}); "
               "the server log has the details under the request id")
    if anthropic:
        return orjson.dumps({"custom_id": custom_id, "result": {"type": "errored", "error": {
            "type": "error", "error": {"type": "api_error", "message": message}}}}), False
    return orjson.dumps({"id": _hid("batch_req_", rid), "custom_id": custom_id,
                         "response": {"status_code": 500, "request_id": rid, "body": {"error": {
                             "message": message, "type": "server_error", "param": None,
                             "code": "result_unwritable"}}},
                         "error": None}), True


def write_refused_messages(store: Store, batch: BatchRow,
                           line_errors: dict[int, str]) -> tuple[str | None, int]:
    """A Message Batch that failed validation: (results file id, requests in it), every
    request `errored` (Anthropic reports a batch's bad requests per request): its own
    problem, or that it did not run because other lines of its batch were refused. A line
    too broken to name its custom_id is reported as `line-N`."""
    first = min(line_errors) if line_errors else None

    def result(no: int) -> dict[str, Any]:
        message = line_errors.get(no) or (
            f"not run: this batch was refused at validation (line {first}: "
            f"{line_errors[first]})" if first is not None else "not run")
        return {"type": "errored", "error": {"type": "error", "error": {
            "type": "invalid_request_error", "message": message}}}

    return _unrun_messages(store, batch, result)


def write_unrun_messages(store: Store, batch: BatchRow, status: str) -> tuple[str | None, int]:
    """A Message Batch cancelled or expired before its requests were published: (results
    file id, requests in it), every request `canceled` or `expired`, as Anthropic reports
    them (not an ended batch without results)."""
    kind = {"type": "expired" if status == EXPIRED else "canceled"}
    return _unrun_messages(store, batch, lambda _no: kind)


def _unrun_messages(store: Store, batch: BatchRow,
                    result: Callable[[int], dict[str, Any]]) -> tuple[str | None, int]:
    n = 0

    def lines() -> Iterator[bytes]:
        nonlocal n
        for no, raw in store.iter_file_lines(batch.input_file_id):  # type: ignore[arg-type]
            if not raw.strip():
                continue
            try:
                cid = parse_json(raw).get("custom_id")
            except (ValueError, AttributeError):
                cid = None
            n += 1
            yield orjson.dumps({"custom_id": cid if isinstance(cid, str) else f"line-{no}",
                                "result": result(no)}) + b"\n"

    row = store.create_file(lines(), purpose="batch_output",
                            filename=f"{batch.id}_results.jsonl", owner=batch.owner,
                            expires_at=output_expiry(batch))
    if not row.line_count:
        store.delete_file(row.id)
        return None, 0
    return row.id, n


class LostLease(Exception):
    """Raised inside the writer when another sweeper took the batch over."""


@dataclass
class WrittenResults:
    output_file_id: str | None
    error_file_id: str | None
    lines: int
    errors: int
    # {completed, failed, cancelled, expired: lines written as such}: the batch's final
    # request counts, exactly what its files hold
    counts: dict[str, int] = field(default_factory=dict)


def _outcome(row: dict[str, Any] | None, batch_status: str) -> str:
    """The request status a result line reports (COMPLETED, FAILED, CANCELLED, EXPIRED)."""
    gone = _unfinished(row, batch_status)
    if gone is not None:
        return gone
    assert row is not None
    return COMPLETED if row["status"] == COMPLETED else FAILED


def _pages(store: Store, batch: BatchRow) -> Iterator[list[tuple[str, str, str, bool]]]:
    """Pages of (custom_id, request_id, model, calls tools) in input order (non-blank
    lines)."""
    anthropic = batch.endpoint == MESSAGES_URL
    page: list[tuple[str, str, str, bool]] = []
    for no, raw in store.iter_file_lines(batch.input_file_id):  # type: ignore[arg-type]
        if not raw.strip():
            continue
        # the parser validation used: what passed it reads the same here
        obj = parse_json(raw, what=f"input line {no}")
        cid = obj["custom_id"]
        body = obj.get("params") if anthropic else obj.get("body")
        model = body.get("model") if isinstance(body, dict) else None
        page.append((cid, request_id_for(batch.id, cid), model if isinstance(model, str) else "",
                     calls_tools(body, anthropic)))
        if len(page) >= PAGE:
            yield page
            page = []
    if page:
        yield page


def write_results(store: Store, batch: BatchRow, *, default_model: str, final_status: str,
                  keep_lease: Callable[[], bool] | None = None) -> WrittenResults:
    """Write the batch's output (and, for OpenAI endpoints, error) file from its input file
    and request rows; `final_status` is the status the batch is about to take (decides
    whether unfinished requests read as expired or cancelled). `keep_lease()` is called
    every page and must return True to go on (the writer stops if it lost the batch).

    The input is read a page at a time and the error lines are spooled to a temporary file
    (on disk past 8 MB), so memory stays flat whatever the batch size."""
    anthropic = batch.endpoint == MESSAGES_URL
    counts = {"lines": 0, "errors": 0}
    outcomes = dict.fromkeys((COMPLETED, FAILED, CANCELLED, EXPIRED), 0)
    spool = tempfile.SpooledTemporaryFile(max_size=8 << 20)

    def fetched() -> Iterator[tuple[list[tuple[str, str, str, bool]], dict[str, Any]]]:
        """(page, its rows), the next page's rows fetched while this one is formatted."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="results") as pool:
            ahead: tuple[Any, Future[dict[str, Any]]] | None = None
            for page in _pages(store, batch):
                nxt = (page, pool.submit(store.result_rows, [p[1] for p in page]))
                if ahead is not None:
                    yield ahead[0], ahead[1].result()
                ahead = nxt
            if ahead is not None:
                yield ahead[0], ahead[1].result()

    def output() -> Iterator[bytes]:
        for page, rows in fetched():
            if keep_lease is not None and not keep_lease():
                raise LostLease(batch.id)
            out = []
            for cid, rid, model, tools in page:
                row = rows.get(rid)
                counts["lines"] += 1
                try:
                    outcome = _outcome(row, final_status)
                    if anthropic:
                        data = orjson.dumps(anthropic_line(
                            cid, rid, row, model=model or default_model,
                            batch_status=final_status, tools=tools))
                        is_error = False
                    else:
                        line, is_error = openai_line(cid, rid, row,
                                                     endpoint=batch.endpoint or CHAT_URL,
                                                     model=model or default_model,
                                                     batch_status=final_status, tools=tools)
                        data = orjson.dumps(line)
                except Exception as exc:  # noqa: BLE001 — one unreadable row, not the batch
                    log.error("batch %s: the result of request %s cannot be written (%s: %s); "
                              "it is reported as failed", batch.id, rid, type(exc).__name__, exc)
                    outcome, (data, is_error) = FAILED, _unwritable(cid, rid, anthropic, exc)
                outcomes[outcome] += 1
                if is_error:
                    counts["errors"] += 1
                    spool.write(data + b"\n")
                else:
                    out.append(data)
            if out:
                yield b"\n".join(out) + b"\n"

    stem = batch.id
    with spool:
        out_row = store.create_file(output(), purpose="batch_output",
                                    filename=f"{stem}_output.jsonl", owner=batch.owner,
                                    expires_at=output_expiry(batch))
        err_id = None
        if counts["errors"]:
            spool.seek(0)
            err_row = store.create_file(iter(lambda: spool.read(1 << 20), b""),
                                        purpose="batch_errors", filename=f"{stem}_errors.jsonl",
                                        owner=batch.owner, expires_at=output_expiry(batch))
            err_id = err_row.id
    out_id = out_row.id if out_row.line_count else None
    if out_id is None:
        store.delete_file(out_row.id)
    return WrittenResults(out_id, err_id, counts["lines"], counts["errors"], outcomes)

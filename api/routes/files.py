"""OpenAI Files: upload a batch input, read a file's metadata and content, list files.

    POST /v1/files                (multipart: file, purpose=batch)  -> File object
    GET  /v1/files[?purpose=&limit=&after=&order=]                  -> list (cursor paging)
    GET  /v1/files/{file_id}                                        -> File object
    DELETE /v1/files/{file_id}                                      -> {id, deleted: true}
    GET  /v1/files/{file_id}/content                                -> the bytes (JSONL)

Uploads stream into the store (store.files: 1 MiB chunks in the database) while their
lines are counted and measured (api/uploads.py); a file over a cap is removed and the
client told which cap and which line. Output and error files of batches are read here too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Annotated, Literal
from urllib.parse import quote

from anyio import to_thread
from fastapi import APIRouter, File, Form, Path, Query, UploadFile
from fastapi.responses import Response, StreamingResponse

from inflight.api.context import ApiContext
from inflight.api.deps import Caller, Ctx, owns
from inflight.api.errors import APIError, not_found
from inflight.api.models.errors import OPENAI_ERRORS
from inflight.api.models.files import FileDeleted, FileList, FileObject, file_object
from inflight.api.responses import json_response
from inflight.api.routing import ApiRoute
from inflight.api.uploads import LineCaps
from inflight.schemas.base import ID_RE
from inflight.producers.batch_jobs import expiry_seconds
from inflight.store import new_file_id
from inflight.store.models import utcnow

router = APIRouter(route_class=ApiRoute, prefix="/v1/files", tags=["files"],
                   responses=OPENAI_ERRORS)
FileId = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$",
                             description="the file id (file-...)")]
UPLOAD_PURPOSES = ("batch",)


@router.post("", response_model=FileObject, summary="Upload a batch input file (JSONL)")
async def upload_file(ctx: Ctx, caller: Caller, file: Annotated[UploadFile, File()],
                      purpose: Annotated[str, Form()],
                      expires_anchor: Annotated[str | None, Form(
                          alias="expires_after[anchor]", description="created_at")] = None,
                      expires_seconds: Annotated[str | None, Form(
                          alias="expires_after[seconds]",
                          description="the file expires this long after it was created")] = None,
                      ) -> Response:
    if purpose not in UPLOAD_PURPOSES:
        raise APIError(400, f"purpose {purpose!r:.40}: upload batch input files with "
                            "purpose 'batch'", param="purpose")
    expires_at = None
    if expires_anchor is not None or expires_seconds is not None:
        seconds = expiry_seconds({"anchor": expires_anchor, "seconds": int(expires_seconds)
                                  if (expires_seconds or "").isdigit() else expires_seconds},
                                 "expires_after")
        expires_at = utcnow() + timedelta(seconds=seconds)
    fid, caps = new_file_id(), LineCaps(ctx.settings.api_max_upload_lines,
                                        ctx.settings.api_max_line_bytes)
    name = (file.filename or "upload.jsonl")[:512]

    def store_it():
        try:
            return ctx.store.create_file(caps.pieces(file.file), purpose="batch", filename=name,
                                         owner=caller.owner, file_id=fid,
                                         expires_at=expires_at)
        except BaseException:
            ctx.store.delete_file(fid)  # nothing half-stored stays behind
            raise

    # its own thread, not a database slot: an upload holds it for as long as it streams
    row = await to_thread.run_sync(store_it)
    if row.bytes == 0:
        await ctx.db(ctx.store.delete_file, fid)
        raise APIError(400, "the file is empty; upload one request per line", param="file")
    ctx.metrics.inc("files_uploaded")
    return json_response(file_object(row))


async def owned_file(ctx: ApiContext, caller: Caller, file_id: str):
    # NOTE: an id no file can have is not looked up (Postgres refuses a NUL in a query)
    row = await ctx.db(ctx.store.get_file, file_id) if ID_RE.match(file_id) else None
    if row is None or not owns(caller, row.owner):
        raise not_found("file", file_id)
    return row


@router.get("", response_model=FileList,
            summary="List your files, newest first (order=asc: oldest first)")
async def list_files(ctx: Ctx, caller: Caller,
                     purpose: Annotated[str | None, Query(pattern=r"^[A-Za-z0-9_.\-]{1,32}$")] = None,
                     limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
                     after: Annotated[str | None, Query(max_length=128)] = None,
                     order: Annotated[Literal["asc", "desc"], Query()] = "desc") -> Response:
    # NOTE: OpenAI's default page is 10,000: the SDK's `for f in files.list(): delete(f)`
    # then reads one page, and never pages from a cursor it has just deleted
    if after is not None:
        try:
            await owned_file(ctx, caller, after)
        except APIError:
            raise APIError(404, f"after: no file {after!r:.140} to page from (deleted, or "
                                "never yours); list again without `after`", param="after",
                           code="not_found") from None
    rows = await ctx.db(lambda: ctx.store.list_files(owner=caller.owner, purpose=purpose,
                                                     limit=limit + 1, after=after,
                                                     order=order))
    page = [file_object(r) for r in rows[:limit]]
    return json_response({"object": "list", "data": page,
                          "first_id": page[0]["id"] if page else None,
                          "last_id": page[-1]["id"] if page else None,
                          "has_more": len(rows) > limit})


@router.get("/{file_id}", response_model=FileObject, summary="A file's metadata")
async def retrieve_file(file_id: FileId, ctx: Ctx, caller: Caller) -> Response:
    return json_response(file_object(await owned_file(ctx, caller, file_id)))


@router.delete("/{file_id}", response_model=FileDeleted,
               responses={409: {"description": "an open batch reads this file"}},
               summary="Delete a file")
async def delete_file(file_id: FileId, ctx: Ctx, caller: Caller) -> Response:
    row = await owned_file(ctx, caller, file_id)
    user = await ctx.db(ctx.store.file_in_use, row.id)
    if user is not None:
        raise APIError(409, f"file {file_id} is the input of batch {user}, which has not "
                            "ended; cancel the batch or wait for it to end, then delete the "
                            "file", param="file_id", code="file_in_use")
    await ctx.db(ctx.store.delete_file, row.id)
    ctx.metrics.inc("files_deleted")
    return json_response({"id": row.id, "object": "file", "deleted": True})


@router.get("/{file_id}/content", response_class=StreamingResponse,
            responses={200: {"content": {"application/jsonl": {}},
                             "description": "the file's bytes"}},
            summary="A file's content")
async def file_content(file_id: FileId, ctx: Ctx, caller: Caller) -> StreamingResponse:
    row = await owned_file(ctx, caller, file_id)
    return StreamingResponse(stream_file(ctx, row.id), media_type="application/jsonl",
                             headers={"Content-Disposition": content_disposition(row.filename)})


def content_disposition(filename: str) -> str:
    """`attachment` with the stored name: printable ASCII in `filename` (a quote, a control
    character or DEL in the header would make the server drop the response), the exact
    name as RFC 5987's `filename*`."""
    plain = "".join(c if " " <= c <= "~" and c not in '"\\' else "_" for c in filename)
    return f"attachment; filename=\"{plain}\"; filename*=UTF-8''{quote(filename.encode('utf-8', 'replace'), safe='')}"


async def stream_file(ctx: ApiContext, file_id: str) -> AsyncIterator[bytes]:
    """A stored file, chunk by chunk (each read on a database thread)."""
    chunks = ctx.store.iter_file(file_id)

    def step() -> bytes | None:
        return next(chunks, None)

    while (piece := await ctx.db(step)) is not None:
        yield piece

"""OpenAI File objects."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["processed"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


def file_object(row: Any) -> dict[str, Any]:
    return {"id": row.id, "object": "file", "bytes": row.bytes,
            "created_at": int(row.created_at.timestamp()), "filename": row.filename,
            "purpose": row.purpose, "status": "processed",
            "expires_at": int(row.expires_at.timestamp()) if row.expires_at else None,
            "status_details": None}

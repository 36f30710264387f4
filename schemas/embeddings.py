"""Embedding vectors on the wire and in the store: float32, little-endian, packed.

    FinalEvent.embedding   base64 of the packed bytes (JSON carries text): 4 bytes a dimension
    requests.embedding     the packed bytes themselves (store/models.py: LargeBinary)

A 384-dimension vector is 1,536 bytes (2,048 in base64), against ~7 KB as JSON floats.
Stdlib only (no numpy): the pipeline client decodes vectors too.
"""

from __future__ import annotations

import base64
import binascii
import struct
import sys
from array import array
from typing import Annotated, Sequence

from pydantic import AfterValidator, Field

MAX_DIMENSIONS = 65536


def pack_vector(values: Sequence[float]) -> bytes:
    """float32 little-endian bytes of a vector (a numpy float32 array passes as is)."""
    tobytes = getattr(values, "astype", None)
    if tobytes is not None:  # numpy: one copy, no Python floats
        return values.astype("<f4").tobytes()
    a = array("f", values)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def unpack_vector(data: bytes) -> list[float]:
    if len(data) % 4:
        raise ValueError(f"an embedding is float32 bytes: {len(data)} is not a multiple of 4")
    return list(struct.unpack(f"<{len(data) // 4}f", data))


def encode_vector(values: Sequence[float]) -> str:
    """The base64 text of a vector (OpenAI's encoding_format "base64" is the same bytes)."""
    return base64.b64encode(pack_vector(values)).decode("ascii")


def decode_vector(text: str) -> list[float]:
    return unpack_vector(base64.b64decode(text, validate=True))


def _check_b64(text: str) -> str:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not base64 (float32 little-endian bytes of the vector)") from None
    if len(raw) % 4 or not raw:
        raise ValueError(f"decodes to {len(raw)} bytes, not a non-empty float32 vector")
    return text


EmbeddingB64 = Annotated[str, Field(max_length=4 * MAX_DIMENSIONS * 4 // 3 + 4),
                         AfterValidator(_check_b64)]

"""Uploaded batch files: counted while they stream into the store, never held whole.

`LineCaps.pieces(fh)` yields the file in 1 MiB pieces and stops with an APIError the
moment it has more than `max_lines` lines or a line longer than `max_line_bytes`
(naming the line). The caller stores the pieces under a file id it chose, so it can
remove what was stored when the check fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from inflight.api.errors import APIError

PIECE = 1 << 20


@dataclass
class LineCaps:
    max_lines: int
    max_line_bytes: int
    lines: int = 0          # complete lines seen so far
    current: int = 0        # bytes of the line being read

    def _over(self, line_no: int, size: int) -> APIError:
        return APIError(413, f"line {line_no} is over {self.max_line_bytes:,} bytes "
                             f"(server setting INFLIGHT_API_MAX_LINE_BYTES); split or shorten "
                             "it", param="file", code="line_too_large")

    def pieces(self, fh: BinaryIO) -> Iterator[bytes]:
        while True:
            piece = fh.read(PIECE)
            if not piece:
                break
            start = 0
            while True:
                nl = piece.find(b"\n", start)
                end = len(piece) if nl < 0 else nl
                self.current += end - start
                if self.current > self.max_line_bytes:
                    raise self._over(self.lines + 1, self.current)
                if nl < 0:
                    break
                self.lines += 1
                self.current, start = 0, nl + 1
                self._check_count()
            yield piece
        if self.current:
            self.lines += 1
            self.current = 0
            self._check_count()

    def _check_count(self) -> None:
        if self.lines > self.max_lines:
            raise APIError(413, f"the file has more than {self.max_lines:,} lines (server "
                                "setting INFLIGHT_API_MAX_UPLOAD_LINES); split it into "
                                "several batches", param="file", code="too_many_lines")

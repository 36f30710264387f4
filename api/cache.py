"""Answers to polls of finished requests, kept in memory.

NOTE: a final row never changes (store/queries.py: the first final wins, nothing moves
backwards, the owner is set once at submit), so its JSON answer can be served again
without asking the database. Only final rows are kept; the cache is bounded by bytes and
evicts the least recently used. Each API process keeps its own.
"""

from __future__ import annotations

from collections import OrderedDict

MAX_ENTRY_BYTES = 256 * 1024  # a huge answer is not worth the memory


class FinalAnswers:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self._entries: OrderedDict[str, tuple[str | None, bytes]] = OrderedDict()

    def get(self, request_id: str) -> tuple[str | None, bytes] | None:
        """(owner, JSON body) of a finished request seen before, else None."""
        entry = self._entries.get(request_id)
        if entry is not None:
            self._entries.move_to_end(request_id)
            self.hits += 1
        return entry

    def put(self, request_id: str, owner: str | None, body: bytes) -> None:
        if len(body) > MAX_ENTRY_BYTES or self.max_bytes <= 0 or request_id in self._entries:
            return
        self._entries[request_id] = (owner, body)
        self.bytes += len(body)
        while self.bytes > self.max_bytes and self._entries:
            _, (_, old) = self._entries.popitem(last=False)
            self.bytes -= len(old)

    def __len__(self) -> int:
        return len(self._entries)

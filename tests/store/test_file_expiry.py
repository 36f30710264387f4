"""Files past their expires_at: hidden at once, deleted (with their chunks) by the sweep's
store call; on SQLite and Postgres."""

from __future__ import annotations

from datetime import timedelta

from inflight.store import Store
from inflight.store.models import utcnow


def test_expired_files_are_hidden_then_deleted(db_url):
    store = Store(db_url, create=True)
    try:
        old = store.create_file(iter([b'{"a": 1}\n']), purpose="batch", filename="old.jsonl",
                                expires_at=utcnow() - timedelta(seconds=1))
        new = store.create_file(iter([b'{"a": 2}\n']), purpose="batch", filename="new.jsonl",
                                expires_at=utcnow() + timedelta(hours=1))
        forever = store.create_file(iter([b'{"a": 3}\n']), purpose="batch", filename="f.jsonl")
        assert store.get_file(old.id) is None                 # expired: not served
        assert store.get_file(new.id) is not None and store.get_file(forever.id) is not None
        assert old.id in store.delete_expired_files()
        assert not store._file_row(old.id)
        assert store.get_file(new.id).expires_at == new.expires_at
    finally:
        store.close()

"""`inflight keys create / update` with limits and `inflight usage`, on SQLite."""

from __future__ import annotations

import orjson


def _run(capsys, monkeypatch, db, *argv) -> tuple[int, object]:
    from inflight.cli.main import main

    monkeypatch.setenv("INFLIGHT_DATABASE_URL", db)
    rc = main(list(argv))
    return rc, orjson.loads(capsys.readouterr().out)


def test_keys_limits_and_usage(tmp_path, capsys, monkeypatch):
    db = f"sqlite:///{tmp_path / 'inflight.db'}"
    rc, made = _run(capsys, monkeypatch, db, "keys", "create", "pipe", "--owner", "team-a",
                    "--rpm", "60", "--tpm", "1000", "--max-concurrent", "4", "--json")
    assert rc == 0 and (made["rpm"], made["tpm"], made["max_concurrent"]) == (60, 1000, 4)
    assert made["max_queued_tokens"] is None and made["admin"] is False
    rc, upd = _run(capsys, monkeypatch, db, "keys", "update", made["id"], "--rpm", "none",
                   "--max-queued-tokens", "5000", "--admin", "true", "--json")
    assert rc == 0 and upd["rpm"] is None and upd["tpm"] == 1000  # untouched flags stay
    assert upd["max_queued_tokens"] == 5000 and upd["admin"] is True
    rc, missing = _run(capsys, monkeypatch, db, "keys", "update", "key_000000000000",
                       "--rpm", "5", "--json")
    assert rc == 1 and missing["status"] == "not_found"
    rc, usage = _run(capsys, monkeypatch, db, "usage", "--json")
    assert rc == 0 and usage == {"data": []}

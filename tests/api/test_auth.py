"""API keys: hashed at rest, no key -> 401, revoked -> 401, another key's ids -> 404,
the CLI, and INFLIGHT_API_AUTH=off."""

from __future__ import annotations

import logging

import orjson
import pytest
from sqlalchemy import select

from inflight.api.keys import all_keys, create_key, lookup, parse_token, revoke
from inflight.schemas.errors import ConfigError
from inflight.store import Store
from inflight.store.keys import ApiKeyRow
from tests.api.server import ApiServer
from tests.consumers.conftest import make_settings

pytestmark = [pytest.mark.broker]


def test_keys_are_stored_hashed_and_checked(tmp_path):
    with Store(f"sqlite:///{tmp_path / 'k.db'}", create=True) as store:
        new = create_key(store, "pipeline")
        key_id, secret = parse_token(new.token)
        assert key_id == new.info.id and new.info.owner == key_id
        with store.session() as s:
            row = s.scalars(select(ApiKeyRow)).one()
        assert secret not in row.secret_hash and row.secret_hash.startswith("$argon2id$")
        assert lookup(store, new.token) == new.info
        assert lookup(store, new.token[:-1] + ("0" if new.token[-1] != "0" else "1")) is None
        assert lookup(store, "inf_000000000000_" + "0" * 48) is None
        assert lookup(store, "not-a-key") is None
        shared = create_key(store, "rotated", owner=new.info.owner)
        assert shared.info.owner == new.info.owner and shared.info.id != new.info.id
        assert revoke(store, new.info.id).revoked
        assert lookup(store, new.token) is None and lookup(store, shared.token) is not None
        assert revoke(store, "key_ffffffffffff") is None
        with pytest.raises(ConfigError):
            revoke(store, "nonsense")
        with pytest.raises(ConfigError):
            create_key(store, "")
        assert [k.name for k in all_keys(store)] == ["pipeline", "rotated"]


def test_cli_create_list_revoke(tmp_path, monkeypatch, capsys):
    from inflight.cli.main import main

    monkeypatch.setenv("INFLIGHT_DATABASE_URL", f"sqlite:///{tmp_path / 'k.db'}")

    def cli(*args: str) -> dict | list:
        assert main(["keys", *args, "--json"]) == 0
        return orjson.loads(capsys.readouterr().out.splitlines()[-1])

    made = cli("create", "nightly")
    assert made["key"].startswith("inf_") and made["name"] == "nightly"
    listed = cli("list")
    assert [k["id"] for k in listed] == [made["id"]] and "key" not in listed[0]
    assert cli("revoke", made["id"])["revoked_at"] is not None
    assert main(["keys", "revoke", "key_000000000000"]) == 1


def test_no_key_bad_key_revoked_key_are_401(stack):
    key = stack.new_key()
    wrong = key.token[:-1] + ("1" if key.token[-1] == "0" else "0")  # the secret, one digit off
    with stack.http() as anon:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic x"},
                        {"Authorization": f"Bearer {wrong}"}):
            resp = anon.get("/v1/requests/x", headers=headers)
            assert resp.status_code == 401, headers
            assert resp.json()["error"]["code"] == "invalid_api_key"
            assert resp.headers["www-authenticate"].startswith("Bearer")
        assert anon.get("/v1/requests/x", headers={"x-api-key": key.token}).status_code == 404
    with stack.http(key) as http:
        assert http.get("/v1/requests/x").status_code == 404
        revoke(stack.store, key.info.id)
        resp = http.get("/v1/requests/x")
        assert resp.status_code == 401 and "revoked" in resp.json()["error"]["message"]


def test_another_keys_request_is_404_and_its_id_is_taken(stack):
    alice, bob = stack.new_key("alice"), stack.new_key("bob")
    with stack.http(alice) as a, stack.http(bob) as b:
        rid = a.post("/v1/requests", json={"prompt": "hello", "params": {"max_tokens": 2},
                                          "request_id": f"own-{alice.info.id}"}).json()["id"]
        assert a.get(f"/v1/requests/{rid}").status_code == 200
        for resp in (b.get(f"/v1/requests/{rid}"), b.delete(f"/v1/requests/{rid}"),
                     b.get(f"/v1/requests/{rid}/events")):
            assert resp.status_code == 404
            assert resp.json()["error"]["message"] == f"No request found with id '{rid}'."
        resp = b.post("/v1/requests", json={"prompt": "mine", "request_id": rid})
        assert resp.status_code == 409 and resp.json()["error"]["param"] == "request_id"
        # a key sharing alice's owner sees her rows
        rotated = stack.new_key("alice-2", owner=alice.info.owner)
        with stack.http(rotated) as r:
            assert r.get(f"/v1/requests/{rid}").status_code == 200


def test_auth_off_serves_everyone_and_says_so_loudly(broker, tmp_path, caplog):
    settings = make_settings(broker, f"sqlite:///{tmp_path / 'o.db'}", api_auth=False)
    with caplog.at_level(logging.WARNING, logger="inflight.api"), ApiServer(settings) as api:
        import httpx

        resp = httpx.post(api.url + "/v1/requests", json={"prompt": "hi"})
        assert resp.status_code == 202
        assert httpx.get(api.url + f"/v1/requests/{resp.json()['id']}").status_code == 200
    assert any("AUTHENTICATION IS OFF" in r.getMessage() for r in caplog.records)

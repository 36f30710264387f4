"""The published contract (schemas/contract.py, schemas/json/): no drift from the wire models,
every committed version's examples valid against its schemas and accepted by today's
readers, and a newer writer's optional fields ignored by the readers of our own output."""

from __future__ import annotations

import copy
import json

import orjson
import pytest
from jsonschema import Draft202012Validator

from inflight.schemas import SchemaError, decode_request
from inflight.schemas.contract import (BY_NAME, CONTRACT_DIR, MESSAGES, committed_versions,
                                       example_message)
from inflight.schemas.export import drift, main

VERSIONS = committed_versions()


def _load(path):
    return json.loads(path.read_text())


def _examples(version: int):
    folder = CONTRACT_DIR / f"v{version}" / "examples"
    return sorted(folder.glob("*.json"))


def test_committed_schemas_match_the_wire_models():
    assert drift() == [], ("the committed JSON Schemas drifted: run `python -m "
                           "inflight.schemas.export` and commit schemas/json/")


def test_export_check_fails_on_drift(tmp_path, capsys):
    assert main(["--out", str(tmp_path)]) == 0
    assert main(["--check", "--out", str(tmp_path)]) == 0
    f = next(tmp_path.rglob("final-event.schema.json"))
    f.write_text(f.read_text().replace('"text"', '"txt"'))
    (f.parent / "stale.schema.json").write_text("{}")
    assert main(["--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "final-event.schema.json: differs" in err and "stale.schema.json" in err


def test_every_version_is_committed_with_examples_of_every_message():
    assert VERSIONS and VERSIONS[0] == 1
    for v in VERSIONS:
        folder = CONTRACT_DIR / f"v{v}"
        index = _load(folder / "index.json")
        assert index["schema_version"] == v
        for name, entry in index["messages"].items():
            Draft202012Validator.check_schema(_load(folder / entry["schema"]))
        Draft202012Validator.check_schema(_load(folder / "headers.schema.json"))
        covered = {example_message(p.stem) for p in _examples(v)}
        assert covered >= set(index["messages"]) - {"result-event"}, covered


@pytest.mark.parametrize("version", VERSIONS)
def test_todays_readers_accept_every_committed_example(version):
    """Compatibility: each example of each committed version is valid against that
    version's schema, and the current reader of its message accepts it."""
    folder = CONTRACT_DIR / f"v{version}"
    for path in _examples(version):
        name = example_message(path.stem)
        body = _load(path)
        schema = _load(folder / f"{name}.schema.json")
        Draft202012Validator(schema).validate(body)
        if name in ("token-event", "status-event", "final-event", "error-event"):  # the union
            Draft202012Validator(_load(folder / "result-event.schema.json")).validate(body)
        got = BY_NAME[name].read(orjson.dumps(body))
        assert got is not None, path


def _with_unknown_fields(body: dict) -> dict:
    """`body` as a newer writer might send it: an optional field added at the top and in
    every nested object."""
    out = copy.deepcopy(body)

    def add(obj):
        if isinstance(obj, dict):
            for v in obj.values():
                add(v)
            obj["x_added_later"] = {"any": ["json", 1]}
        elif isinstance(obj, list):
            for v in obj:
                add(v)

    add(out)
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_optional_fields_of_a_newer_writer_do_not_break_readers(version):
    """The open messages (everything the project writes) are read with unknown fields
    dropped; their schemas allow them too. Requests stay strict: an unknown request field
    ends the request with an error naming it (upgrade workers before producers)."""
    folder = CONTRACT_DIR / f"v{version}"
    for path in _examples(version):
        name = example_message(path.stem)
        msg = BY_NAME[name]
        newer = _with_unknown_fields(_load(path))
        schema = Draft202012Validator(_load(folder / f"{name}.schema.json"))
        if msg.strict:
            assert not schema.is_valid(newer)
            with pytest.raises(SchemaError, match="unknown field"):
                decode_request(orjson.dumps(newer))
            continue
        schema.validate(newer)
        got = msg.read(orjson.dumps(newer))
        base = msg.read(path.read_bytes())
        assert got == base, path


def test_schemas_are_not_vacuous():
    """Broken messages fail the schema as they fail the reader."""
    folder = CONTRACT_DIR / f"v{VERSIONS[-1]}"
    request = Draft202012Validator(_load(folder / "request.schema.json"))
    assert not request.is_valid({"prompt": "no id"})
    assert not request.is_valid({"request_id": "r", "prompt": "x", "priority": "high"})
    assert not request.is_valid({"request_id": "bad id!", "prompt": "x"})
    assert not request.is_valid({"request_id": "r", "prompt": "x", "prompt_token_ids": [1]})
    assert not request.is_valid({"request_id": "r"})
    assert request.is_valid({"request_id": "r", "prompt": None, "prompt_token_ids": [1]})
    final = Draft202012Validator(_load(folder / "final-event.schema.json"))
    assert not final.is_valid({"type": "final", "request_id": "r", "text": "x",
                               "finish_reason": "done"})
    assert {m.name for m in MESSAGES} == set(_load(folder / "index.json")["messages"])


def test_the_batch_event_a_webhook_gets_is_the_committed_schema():
    """producers/webhooks.py writes the batch-events topic's bodies: they follow the schema
    and today's reader takes them."""
    from datetime import datetime, timezone
    from types import SimpleNamespace

    from inflight.producers.webhooks import EVENT_TYPES, event_body
    from inflight.schemas.batch_event import decode_batch_event

    schema = Draft202012Validator(_load(CONTRACT_DIR / f"v{VERSIONS[-1]}" / "batch-event.schema.json"))
    for kind in EVENT_TYPES:
        body = event_body(SimpleNamespace(id="evt_1", type=kind, batch_id="batch_9",
                                          created_at=datetime.now(timezone.utc)))
        schema.validate(json.loads(body))
        assert decode_batch_event(body).data.id == "batch_9"

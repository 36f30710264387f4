"""`inflight submit / result / stream / cancel` in-process, and `inflight demo` end to end."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from tests.kafka_read import read_topic

pytestmark = [pytest.mark.broker]


@pytest.fixture
def cli_env(kafka_settings, monkeypatch):
    from inflight.cli.commands import settings_env

    for key, value in settings_env(kafka_settings).items():
        monkeypatch.setenv(key, value)
    return kafka_settings


def _run(capsys, *argv) -> tuple[int, str]:
    from inflight.cli.main import main

    rc = main(list(argv))
    return rc, capsys.readouterr().out




def test_result_and_stream_of_an_unknown_id_say_not_found(cli_env, capsys):
    rc, out = _run(capsys, "result", "nope-123")
    assert rc == 1 and out.strip() == "nope-123: not found"
    rc, out = _run(capsys, "result", "nope-123", "--json")
    assert rc == 1 and orjson.loads(out)["status"] == "not_found"
    rc, out = _run(capsys, "stream", "nope-123", "--timeout", "1", "--json")
    assert rc == 1 and orjson.loads(out)["status"] == "not_found"


def test_submit_prompt_and_openai_batch_file(cli_env, capsys, tmp_path):
    s = cli_env
    rc, out = _run(capsys, "submit", "hello", "there", "--max-tokens", "5", "--temperature", "0",
                   "--id", "cli-1", "--json")
    assert rc == 0 and orjson.loads(out) == {"request_id": "cli-1", "status": "submitted"}
    rec = read_topic(s, s.topic_requests, 1)[0]
    body = orjson.loads(rec.value)
    assert body["prompt"] == "hello there" and body["params"]["max_tokens"] == 5

    f = tmp_path / "batch.jsonl"
    f.write_text("\n".join([
        orjson.dumps({"custom_id": "oa-1", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": "default", "messages": [{"role": "user", "content": "hi"}],
                               "max_tokens": 7}}).decode(),
        orjson.dumps({"request_id": "own-1", "prompt": "plain line"}).decode(),
        "{broken",
    ]) + "\n")
    rc, out = _run(capsys, "submit", "--file", str(f), "--batch-id", "job1", "--json")
    res = orjson.loads(out)
    assert rc == 1 and res["submitted"] == 2 and res["bad_lines"] == 1  # the bad line is reported
    recs = read_topic(s, s.topic_requests_batch, 2)
    bodies = {orjson.loads(r.value)["request_id"]: orjson.loads(r.value) for r in recs}
    assert [(m["role"], m["content"]) for m in bodies["oa-1"]["messages"]] == [("user", "hi")]
    assert bodies["oa-1"]["params"]["max_tokens"] == 7
    assert bodies["own-1"]["batch_id"] == "job1"

    rc, out = _run(capsys, "cancel", "cli-1")
    assert rc == 0 and "cancel sent" in out


def test_submit_names_a_model(cli_env, capsys):
    """--model: no live worker serves it -> a typed error, exit 2, nothing sent; with
    --allow-unserved it waits in its own model's topic (transport/model_topics.py)."""
    from inflight.transport.model_topics import ModelTopics

    s = cli_env
    rc = _run(capsys, "submit", "hi", "--model", "tiny-z", "--json")[0]
    assert rc == 2
    rc, out = _run(capsys, "submit", "hi", "--model", "tiny-z", "--allow-unserved", "--id",
                   "cli-z", "--json")
    assert rc == 0 and orjson.loads(out)["request_id"] == "cli-z"
    rec = read_topic(s, ModelTopics.named(s, "tiny-z").requests, 1)[0]
    assert orjson.loads(rec.value)["model"] == "tiny-z"
    rc, out = _run(capsys, "submit", "hi", "--model", "default", "--id", "cli-d", "--json")
    assert rc == 0  # the default model always takes requests, under any of its names
    (rec,) = read_topic(s, s.topic_requests, 1)  # today's topic, no model on the wire
    assert orjson.loads(rec.value)["request_id"] == "cli-d"
    assert orjson.loads(rec.value)["model"] is None


def test_models_lists_the_registry_and_topics_create_makes_a_models_topics(cli_env, capsys):
    import time

    from inflight.schemas.registry import ModelRecord
    from inflight.transport.model_topics import ModelTopics
    from inflight.transport.registry_writer import RegistryAnnouncer

    s = cli_env
    rc, out = _run(capsys, "topics", "create", "--partitions", "1", "--model", "big/one", "--json")
    made = orjson.loads(out)
    big = ModelTopics.named(s, "big/one")
    assert rc == 0 and made[big.requests] == "created" and made[big.batch] == "created"
    assert made[s.topic_models] == "exists"  # created with the others (compacted)
    now = time.time()
    announcer = RegistryAnnouncer(s, [ModelRecord(
        model="big/one", worker="host:1/abc", requests_topic=big.requests, batch_topic=big.batch,
        group=big.group, max_model_len=4096, dtype="bfloat16", heartbeat_at=now,
        heartbeat_s=5.0, started_at=now)])
    announcer.beat(force=True)
    rc, out = _run(capsys, "models", "--json")
    (line,) = [orjson.loads(x) for x in out.splitlines()]
    assert rc == 0 and line["id"] == "big/one" and line["max_model_len"] == 4096
    assert line["workers"] == ["host:1/abc"] and line["requests_topic"] == big.requests
    rc, out = _run(capsys, "models")
    assert "big/one" in out and "4096" in out and "bfloat16" in out
    announcer.withdraw()
    rc, out = _run(capsys, "models")
    assert rc == 0 and "no model has live workers" in out
    rc, out = _run(capsys, "models", "--all")
    assert "big/one" not in out  # withdrawn: gone from the registry, not only stale


def test_submit_constraint_flags(cli_env, capsys, tmp_path):
    s = cli_env
    schema = tmp_path / "person.json"
    schema.write_text('{"type": "object", "properties": {"name": {"type": "string"}}}')
    runs = [(["--json-schema", str(schema)], {"json": {"type": "object", "properties": {
                "name": {"type": "string"}}}}),
            (["--regex", "[0-9]{3}"], {"regex": "[0-9]{3}"}),
            (["--choice", "yes", "--choice", "no"], {"choice": ["yes", "no"]}),
            (["--json-object"], {"json_object": True})]
    for i, (flags, want) in enumerate(runs):
        rc, _ = _run(capsys, "submit", "hi", "--id", f"so-{i}", "--json", *flags)
        assert rc == 0
    bodies = {orjson.loads(r.value)["request_id"]: orjson.loads(r.value)
              for r in read_topic(s, s.topic_requests, len(runs))}
    for i, (_, want) in enumerate(runs):
        got = {k: v for k, v in bodies[f"so-{i}"]["params"]["structured_outputs"].items()
               if v is not None}
        assert got == want
    # a schema that does not compile is refused before anything is sent, with the reason
    from inflight.cli.main import main

    schema.write_text('{"type": "strng"}')
    rc = main(["submit", "hi", "--json-schema", str(schema)])
    err = capsys.readouterr().err
    assert rc == 2 and "strng" in err and "structured_outputs.json" in err
    rc = main(["submit", "hi", "--json-schema", str(tmp_path / "missing.json")])
    assert rc == 2 and "--json-schema" in capsys.readouterr().err


def test_demo_runs_the_whole_path():
    from inflight.cli.model import default_model_dir, is_hf_folder
    from inflight.schemas import Settings

    if not is_hf_folder(default_model_dir(Settings())):
        pytest.skip("the bundled SmolLM2 model is not converted on this machine")
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(repo)}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "inflight", "demo", "--max-tokens", "8",
                           "--json"], env=env, cwd=repo, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = orjson.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ok"] and len(report["results"]) == 4
    assert all(r["status"] == "completed" and r["text"] for r in report["results"])
    batch = report["batch"]
    assert batch["status"] == "completed" and [r["custom_id"] for r in batch["results"]] == [
        "faq-1", "faq-2", "faq-3"]
    assert time.monotonic() - t0 < 90

"""`inflight demo`: the whole path on embedded defaults, in one process tree.

    embedded Tansu broker (child process)
      ├─ worker thread:   requests topics ─► Engine(SmolLM2-135M) ─► results topic
      ├─ recorder thread: results topic ─► SQLite (a temp dir, or --data-dir)
      ├─ Celery worker:   batch jobs (embedded filesystem transport, sweep on its beat)
      └─ this thread:     Client.create_batch (a small OpenAI batch, low priority), then
                          Client.submit ─► Client.stream (tokens live) ─► Client.result,
                          then the batch's lifecycle and output lines
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from inflight.schemas import ErrorEvent, SamplingParams, Settings, TokenEvent

DEMO_BATCH = [  # (custom_id, question): an overnight batch in miniature
    ("faq-1", "What is a message queue?"),
    ("faq-2", "Name a color."),
    ("faq-3", "Say hello in French."),
]
DEMO_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about message queues.",
    "Explain a KV cache in one sentence.",
    "List three prime numbers.",
]

# How to try the HTTP API against a running broker, worker and recorder (docs/http-api.md).
API_HINT = """the same over HTTP (api/; OpenAI-compatible, OpenAPI at /openapi.json):
  KEY=$(inflight keys create me --json | python -c 'import json,sys; print(json.load(sys.stdin)["key"])')
  inflight api --port 8000 &
  curl -s -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" localhost:8000/v1/requests -d '{"prompt": "Hi", "params": {"max_tokens": 16}}'
  curl -s -H "Authorization: Bearer $KEY" localhost:8000/v1/requests/ID     # poll; /events streams (SSE)
  or OpenAI(base_url="http://localhost:8000/v1", api_key=KEY).chat.completions.create(...)"""


def run(args: Any, settings: Settings) -> int:
    logging.getLogger("inflight").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from inflight.consumers.recorder import Recorder
    from inflight.consumers.engine_bridge import build_engine
    from inflight.consumers.worker import Worker
    from inflight.cli.broker import EmbeddedBroker
    from inflight.cli.topics import create_topics
    from inflight.producers.batch_tasks import make_worker, worker_app
    from inflight.producers.client import Client

    as_json = bool(getattr(args, "json", False))

    def say(text: str) -> None:
        if not as_json:
            print(text, flush=True)

    t0 = time.monotonic()
    tmp = None
    if args.data_dir:
        data_dir = Path(args.data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="inflight-demo-")
        data_dir = Path(tmp.name)
    db_url = f"sqlite:///{data_dir / 'inflight.db'}"
    say("[1/5] loading the model ...")
    engine = build_engine(settings.updated(model_path=args.model or settings.model_path,
                                           max_num_seqs=16, kv_cache_bytes=128 << 20))
    say(f"      {engine.config.model}")
    with EmbeddedBroker(log_path=data_dir / "tansu.log") as broker:
        s = settings.model_copy(update={
            "kafka_bootstrap": broker.bootstrap, "database_url": db_url,
            "kafka_session_timeout_ms": 2000, "kafka_heartbeat_interval_ms": 500,
            "metrics_interval_s": 0.0, "worker_max_inflight": 16,
            "data_dir": data_dir, "celery_broker": None, "batch_sweep_interval_s": 0.5})
        create_topics(s, partitions=2)
        say(f"[2/5] embedded broker at {broker.bootstrap}; SQLite at {db_url}")
        worker, recorder = Worker(s, engine), Recorder(s)
        model_dir = Path(engine.config.model)
        jobs_app = worker_app(s, model_dir=model_dir, model_name=model_dir.name)
        jobs = make_worker(jobs_app, concurrency=2, pool="threads", beat=True,
                           loglevel="WARNING")
        threads = [threading.Thread(target=worker.run, name="worker", daemon=True),
                   threading.Thread(target=recorder.run, name="recorder", daemon=True),
                   threading.Thread(target=jobs.start, name="celery", daemon=True)]
        for t in threads:
            t.start()
        client = Client(s)
        try:
            lines = b"".join(orjson.dumps({
                "custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": q}],
                         "max_tokens": args.max_tokens, "temperature": 0}}) + b"\n"
                for cid, q in DEMO_BATCH)
            batch = client.create_batch(lines, metadata={"demo": "1"})
            say(f"      batch {batch.id}: {len(DEMO_BATCH)} lines handed to the Celery "
                "worker (it runs at batch priority, beside the prompts below)")
            params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
            ids = [client.submit(messages=[{"role": "user", "content": p}], params=params)
                   for p in DEMO_PROMPTS]
            say(f"[3/5] submitted {len(ids)} chat prompts (max_tokens={args.max_tokens}); "
                "worker and recorder are joining their groups ...")
            say("[4/5] streaming tokens from the results topic:")
            streamed = {}
            for rid, prompt in zip(ids, DEMO_PROMPTS):
                say(f"  > {prompt}")
                if not as_json:
                    print("    ", end="", flush=True)
                n = 0
                for event in client.stream(rid, timeout=90):
                    if isinstance(event, TokenEvent):
                        if event.index == 0 and n:  # a new attempt: the text starts over
                            n = 0
                            say("\n    [restarted]")
                        n += len(event.token_ids)
                        if not as_json:
                            print(event.text.replace("\n", "\n    "), end="", flush=True)
                    elif isinstance(event, ErrorEvent):
                        say(f"\n    [error {event.code}: {event.message}]")
                    else:
                        say(f"\n    [{event.finish_reason}, {n} tokens]")
                streamed[rid] = n
            results = client.wait_many(ids, timeout=30)
            say("[5/5] stored results (polled from SQLite by request id), then the batch:")
            rows = []
            for rid in ids:
                res = results.get(rid) or client.result(rid)
                rows.append(res.to_dict())
                t = res.timings or {}
                lat = (t.get("finished_at") or 0) - (t.get("submitted_at") or 0)
                say(f"  {rid}  {res.status:<9} {res.finish_reason or '':<6} "
                    f"{(res.usage or {}).get('completion_tokens', 0):>3} tokens  "
                    f"{lat:5.2f}s  {(res.text or '')[:60]!r}")
            batch = client.wait_batch(batch.id, timeout=120, poll_s=0.2)
            say(f"      batch {batch.id} {batch.status}: " + " -> ".join(
                f"{name} +{(at - batch.created_at).total_seconds():.1f}s"
                for name, at in (("validating", batch.created_at),
                                 ("in_progress", batch.in_progress_at),
                                 ("finalizing", batch.finalizing_at),
                                 ("completed", batch.completed_at)) if at is not None))
            batch_out = list(client.batch_results(batch.id)) if batch.is_final else []
            for line in batch_out:
                body = line["response"]["body"]
                say(f"  {line['custom_id']}  {body['choices'][0]['finish_reason']:<6} "
                    f"{body['usage']['completion_tokens']:>3} tokens  "
                    f"{body['choices'][0]['message']['content'][:60]!r}")
            ok = (all(r["status"] == "completed" for r in rows) and batch.status == "completed"
                  and len(batch_out) == len(DEMO_BATCH))
            elapsed = time.monotonic() - t0
            say(f"demo: {'ok' if ok else 'FAILED'} in {elapsed:.1f}s — try `inflight result ID` "
                f"against INFLIGHT_DATABASE_URL={db_url} while it runs with --data-dir")
            say(API_HINT)
            if as_json:
                print(orjson.dumps({"ok": ok, "seconds": round(elapsed, 2), "results": rows,
                                    "batch": {"id": batch.id, "status": batch.status,
                                              "results": batch_out}}).decode())
        finally:
            client.close()
            jobs.stop(in_sighandler=False)
            jobs_app.inflight_resources.close()
            worker.stop()
            recorder.stop()
            for t in threads:
                t.join(timeout=30)
    if tmp is not None:
        tmp.cleanup()
    return 0 if ok else 1

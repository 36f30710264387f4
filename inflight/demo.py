"""`inflight demo`: the whole path on embedded defaults, in one process tree.

    embedded Tansu broker (child process)
      ├─ worker thread:   requests topic ─► Engine(SmolLM2-135M) ─► results topic
      ├─ recorder thread: results topic ─► SQLite (a temp dir, or --data-dir)
      └─ this thread:     Client.submit ─► Client.stream (tokens live) ─► Client.result
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from schemas import ErrorEvent, SamplingParams, Settings, TokenEvent

DEMO_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about message queues.",
    "Explain a KV cache in one sentence.",
    "List three prime numbers.",
]


def run(args: Any, settings: Settings) -> int:
    logging.getLogger("inflight").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from consumers.recorder import Recorder
    from consumers.worker import Worker, build_engine
    from inflight.broker import EmbeddedBroker
    from inflight.topics import create_topics
    from producers.client import Client

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
    engine = build_engine(settings, args.model, max_num_seqs=16, kv_cache_mb=128)
    say(f"      {engine.config.model}")
    with EmbeddedBroker(log_path=data_dir / "tansu.log") as broker:
        s = settings.model_copy(update={
            "kafka_bootstrap": broker.bootstrap, "database_url": db_url,
            "kafka_session_timeout_ms": 2000, "kafka_heartbeat_interval_ms": 500,
            "metrics_interval_s": 0.0, "worker_max_inflight": 16})
        create_topics(s, partitions=2)
        say(f"[2/5] embedded broker at {broker.bootstrap}; SQLite at {db_url}")
        worker, recorder = Worker(s, engine), Recorder(s)
        threads = [threading.Thread(target=worker.run, name="worker", daemon=True),
                   threading.Thread(target=recorder.run, name="recorder", daemon=True)]
        for t in threads:
            t.start()
        client = Client(s)
        try:
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
            say("[5/5] stored results (polled from SQLite by request id):")
            rows = []
            for rid in ids:
                res = results.get(rid) or client.result(rid)
                rows.append(res.to_dict())
                t = res.timings or {}
                lat = (t.get("finished_at") or 0) - (t.get("submitted_at") or 0)
                say(f"  {rid}  {res.status:<9} {res.finish_reason or '':<6} "
                    f"{(res.usage or {}).get('completion_tokens', 0):>3} tokens  "
                    f"{lat:5.2f}s  {(res.text or '')[:60]!r}")
            ok = all(r["status"] == "completed" for r in rows)
            elapsed = time.monotonic() - t0
            say(f"demo: {'ok' if ok else 'FAILED'} in {elapsed:.1f}s — try `inflight result ID` "
                f"against INFLIGHT_DATABASE_URL={db_url} while it runs with --data-dir")
            if as_json:
                print(orjson.dumps({"ok": ok, "seconds": round(elapsed, 2), "results": rows}).decode())
        finally:
            client.close()
            worker.stop()
            recorder.stop()
            for t in threads:
                t.join(timeout=30)
    if tmp is not None:
        tmp.cleanup()
    return 0 if ok else 1

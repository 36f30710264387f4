"""`inflight demo`: the whole path on embedded defaults.

Foundation stage: starts the embedded broker, creates the topics, prepares the default
model, publishes the demo prompts to the requests topic and reads them back. The worker,
recorder and store steps join as the engine and service issues land.
"""

from __future__ import annotations

import time
import uuid

import orjson

from inflight.broker import EmbeddedBroker
from inflight.model import resolve_model
from inflight.topics import create_topics
from schemas.settings import Settings

DEMO_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about message queues.",
    "Explain a KV cache in one sentence.",
    "List three prime numbers.",
]


def run(args, settings: Settings) -> int:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    t0 = time.monotonic()
    print("[1/4] preparing the model ...", flush=True)
    model = resolve_model(args.model, settings)
    print(f"      model folder: {model}")
    with EmbeddedBroker() as broker:
        s = settings.model_copy(update={"kafka_bootstrap": broker.bootstrap})
        print(f"[2/4] embedded broker up at {broker.bootstrap}")
        print(f"[3/4] topics: {create_topics(s, partitions=2)}")
        producer = KafkaProducer(acks="all", **s.kafka_common())
        ids = []
        for prompt in DEMO_PROMPTS:
            rid = uuid.uuid4().hex
            ids.append(rid)
            producer.send(s.topic_requests, key=rid.encode(), value=orjson.dumps({"request_id": rid, "prompt": prompt}))
        producer.flush()
        producer.close()
        consumer = KafkaConsumer(auto_offset_reset="earliest", enable_auto_commit=False, **s.kafka_common())
        consumer.assign([TopicPartition(s.topic_requests, p) for p in range(2)])
        seen = {}
        deadline = time.monotonic() + 15
        while len(seen) < len(ids) and time.monotonic() < deadline:
            for records in consumer.poll(500).values():
                for r in records:
                    seen[r.key.decode()] = orjson.loads(r.value)["prompt"]
        consumer.close()
        print(f"[4/4] published {len(ids)} prompts to {s.topic_requests} and read {len(seen)} back:")
        for rid in ids:
            print(f"      {rid}  {seen.get(rid, '(not read back)')!r}")
    print(f"demo: done in {time.monotonic() - t0:.1f}s; the worker/recorder path is not built yet "
          "(engine and service issues), so no tokens are generated.")
    return 0 if len(seen) == len(ids) else 1

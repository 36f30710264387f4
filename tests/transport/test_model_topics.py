"""A model's topic names: the reversible escape stays within Kafka's rules and never makes
two models collide; the default model keeps today's names."""

from __future__ import annotations

import random
import re
import string

import pytest

from inflight.schemas import Settings
from inflight.schemas.base import MODEL_ID_RE
from inflight.schemas.errors import ConfigError
from inflight.transport.model_topics import (MAX_TOPIC_LEN, ModelTopics, model_of, topic_safe,
                                             worker_topics)

KAFKA_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
VISIBLE = "".join(chr(c) for c in range(0x21, 0x7F))


def random_ids(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    common = string.ascii_letters + string.digits + "-._/:"
    out = []
    for _ in range(n):
        alphabet = VISIBLE if rng.random() < 0.3 else common
        out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))))
    return out


@pytest.mark.parametrize("model,safe", [
    ("SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"),
    ("google/gemma-3-270m", "google_2fgemma-3-270m"),
    ("Llama-3.1-8B", "Llama-3_2e1-8B"),
    ("team_a:lora", "team_5fa_3alora"),
])
def test_documented_examples(model, safe):
    assert topic_safe(model) == safe and model_of(safe) == model


def test_every_model_id_reads_back_and_no_two_collide_in_kafka():
    ids = set(random_ids(3000)) | {".", "_", "a.b", "a_b", "a_2eb", "a.2eb", "-", "~!"}
    seen: dict[str, str] = {}
    settings = Settings()
    for model in ids:
        assert MODEL_ID_RE.match(model)
        safe = topic_safe(model)
        assert model_of(safe) == model
        name = ModelTopics.named(settings, model).requests
        assert KAFKA_TOPIC.match(name), name
        # Kafka refuses a topic whose name equals another's with "." and "_" swapped
        collision_key = name.replace(".", "_")
        assert seen.setdefault(collision_key, model) == model, (model, seen[collision_key])


def test_not_an_escape_is_refused():
    for bad in ("a_", "a_2", "a_zz", "a.b", "a b"):
        with pytest.raises(ValueError):
            model_of(bad)


def test_the_default_model_keeps_todays_names():
    s = Settings(served_model_name="small")
    for name in (None, "default", "small"):
        t = ModelTopics.of(s, name)
        assert (t.requests, t.batch, t.group, t.default) == (
            "inflight.requests", "inflight.requests.batch", "inflight-workers", True)
    t = ModelTopics.of(s, "big/one")
    assert (t.requests, t.batch, t.group, t.default) == (
        "inflight.requests.model.big_2fone", "inflight.requests.batch.model.big_2fone",
        "inflight-workers.model.big_2fone", False)


def test_a_worker_reads_the_default_topics_unless_another_model_is_the_default():
    alone = Settings()  # one model per deployment: every worker serves the default
    assert worker_topics(alone, "anything").default
    two = Settings(default_model="small")
    assert worker_topics(two, "small").requests == "inflight.requests"
    big = worker_topics(two, "big")
    assert not big.default and big.requests == "inflight.requests.model.big"


def test_a_name_too_long_for_kafka_is_a_config_error():
    long_id = "/" * 80  # 240 characters escaped
    with pytest.raises(ConfigError, match="249"):
        ModelTopics.named(Settings(), long_id)
    assert len(ModelTopics.named(Settings(), "x" * 128).batch) <= MAX_TOPIC_LEN

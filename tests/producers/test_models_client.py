"""Routing by model from the registry: the live view (one entry per model, adapters with
their `parent`), the default model under all its names, unknown models, and a registry that
cannot be read. The registry reader here is a small in-memory stand-in (the real one is
tested on the broker: tests/transport/test_registry.py, tests/consumers/test_many_models.py)."""

from __future__ import annotations

import time

import pytest

from inflight.producers.models_client import ModelsClient, aggregate
from inflight.schemas import Settings
from inflight.schemas.errors import BrokerError, ModelNotFoundError
from inflight.schemas.registry import ModelRecord


def rec(model, worker, *, default=False, length=None, started=0.0, **kw) -> ModelRecord:
    topics = ("r", "rb", "g") if default else (f"r.model.{model}", f"rb.model.{model}",
                                                f"g.model.{model}")
    return ModelRecord(model=model, worker=worker, requests_topic=topics[0],
                       batch_topic=topics[1], group=topics[2], default=default,
                       max_model_len=length, heartbeat_at=time.time(), heartbeat_s=1.0,
                       started_at=started or time.time(), **kw)


class Registry:
    """The RegistryReader calls ModelsClient makes."""

    def __init__(self, records, ready=True):
        self.records, self.ready, self.error = records, ready, "no broker"

    def live(self):
        return self.records

    def wait_ready(self, timeout):
        return self.ready

    def close(self):
        pass


def test_one_entry_per_model_with_its_workers_and_adapters():
    view = aggregate([rec("small", "w1", default=True, length=512, started=10.0),
                      rec("small", "w2", default=True, length=256, started=5.0),
                      rec("big", "w3", length=4096, adapters=["big:team-a"],
                          quantization="w4-g128-gptq")])
    assert set(view) == {"small", "big", "big:team-a"}
    small = view["small"]
    assert small.workers == ("w1", "w2") and small.max_model_len == 256 and small.default
    assert small.created == 5 and small.card()["parent"] is None
    adapter = view["big:team-a"]
    assert adapter.parent == "big" and adapter.card()["parent"] == "big"
    assert adapter.topics.requests == "r.model.big" and not adapter.default
    assert view["big"].quantization == "w4-g128-gptq"


def test_routes_by_name_the_default_under_all_its_names():
    s = Settings(topic_requests="r", topic_requests_batch="rb", default_model="small")
    models = ModelsClient(s, Registry([rec("small", "w1", default=True, length=512),
                                       rec("big", "w2", length=4096)]))
    assert [m.id for m in models.models()] == ["small", "big"]  # the default first
    for name in (None, "default", "small"):
        route = models.route(name)
        assert (route.model, route.name, route.topic(False), route.topic(True)) == (
            None, "small", "r", "rb")
        assert route.served and route.max_model_len == 512
    big = models.route("big")
    assert (big.model, big.topic(False), big.topic(True), big.max_model_len) == (
        "big", "r.model.big", "rb.model.big", 4096)
    with pytest.raises(ModelNotFoundError) as err:
        models.route("nope")
    assert err.value.model == "nope" and err.value.served == ("big", "small")
    later = models.route("nope", allow_unserved=True)
    assert (later.model, later.served, later.topic(False)) == (
        "nope", False, "r.model.nope")
    assert models.get("default").id == "small" and models.get("nope") is None


def test_the_default_routes_without_any_worker_or_registry():
    s = Settings(served_model_name="mine")
    models = ModelsClient(s, Registry([], ready=False), default_context=777)
    route = models.route(None)
    assert (route.name, route.max_model_len, route.served) == ("mine", 777, False)
    assert models.topics(None).requests == "inflight.requests"
    with pytest.raises(BrokerError, match="registry"):  # a named model cannot be told
        models.route("other")

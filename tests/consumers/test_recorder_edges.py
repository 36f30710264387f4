"""The recorder at its edges, on the real broker and real databases: rows the database
refuses still end as one final row each (an error row saying why) while their neighbours
in the same batch are stored; records whose headers kafka-python used to choke on (a key
that is not UTF-8, a null value) are recorded like any other."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from inflight.schemas import FinalEvent, InferenceRequest, Timings, Usage, encode
from tests.consumers.conftest import Service, make_settings, migrated, wait_rows
from tests.raw_kafka import produce_raw

pytestmark = [pytest.mark.broker]


@contextlib.contextmanager
def refusing_rows_with(store, marker: str) -> Iterator[None]:
    """A trigger that makes the database refuse any requests row whose output, worker or
    prompt contains `marker` (a real refusal of the database, as for a value it cannot
    take); dropped on exit (the Postgres test database is shared)."""
    tag = uuid.uuid4().hex[:8]
    if store.dialect == "postgresql":
        create = [f"""CREATE FUNCTION refuse_{tag}() RETURNS trigger LANGUAGE plpgsql AS $$
                      BEGIN
                        IF NEW.output LIKE '%{marker}%' OR NEW.worker LIKE '%{marker}%'
                           OR NEW.prompt::text LIKE '%{marker}%' THEN
                          RAISE EXCEPTION 'row % refused by the test trigger', NEW.id;
                        END IF;
                        RETURN NEW;
                      END $$""",
                  f"""CREATE TRIGGER refuse_{tag} BEFORE INSERT OR UPDATE ON requests
                      FOR EACH ROW EXECUTE FUNCTION refuse_{tag}()"""]
        drop = [f"DROP TRIGGER refuse_{tag} ON requests", f"DROP FUNCTION refuse_{tag}()"]
    else:
        when = (f"NEW.output LIKE '%{marker}%' OR NEW.worker LIKE '%{marker}%' "
                f"OR CAST(NEW.prompt AS TEXT) LIKE '%{marker}%'")
        create = [f"""CREATE TRIGGER refuse_{op}_{tag} BEFORE {op} ON requests WHEN {when}
                      BEGIN SELECT RAISE(ABORT, 'row refused by the test trigger'); END"""
                  for op in ("INSERT", "UPDATE")]
        drop = [f"DROP TRIGGER refuse_{op}_{tag}" for op in ("INSERT", "UPDATE")]
    with store.engine.begin() as conn:
        for stmt in create:
            conn.execute(text(stmt))
    try:
        yield
    finally:
        with store.engine.begin() as conn:
            for stmt in drop:
                conn.execute(text(stmt))


def _final(rid: str, text_: str = "fine", worker: str = "w1") -> bytes:
    now = time.time()
    return encode(FinalEvent(request_id=rid, text=text_, token_ids=[1, 2], finish_reason="stop",
                             usage=Usage(prompt_tokens=3, completion_tokens=2), worker=worker,
                             timings=Timings(queued_at=now - 1, finished_at=now)))


def _request(rid: str, prompt: str = "hello", **kw) -> bytes:
    return encode(InferenceRequest(request_id=rid, prompt=prompt, **kw))


def _publish(settings, topic: str, items: list[tuple[str, bytes]]) -> None:
    """One record batch on partition 0 (the recorder's topics have one partition here)."""
    produce_raw(settings.kafka_bootstrap, topic, 0, [(key.encode(), value, []) for key, value in items])


@pytest.fixture
def recorder(broker, db_url):
    from inflight.producers.client import Client
    from inflight.store import Store

    url = migrated(db_url)
    settings = make_settings(broker, url, partitions=1)  # one partition: one batch, in order
    store = Store(url)
    svc = Service(settings, None, store, worker=False)
    client = Client(settings, store=store)
    svc.client, svc.store = client, store
    try:
        yield svc
    finally:
        svc.stop()
        client.close()
        store.close()


def test_rows_the_database_refuses_end_as_one_error_row_and_neighbours_are_stored(recorder):
    s, store = recorder.settings, recorder.store
    tag = uuid.uuid4().hex[:8]
    mark = f"REFUSE-{tag}"
    ids = {name: f"{name}-{tag}" for name in
           ("ok1", "ok2", "ok3", "out", "wrk", "prm", "far")}
    with refusing_rows_with(store, mark):
        # a queued row refused for its prompt, then its (storable) final
        _publish(s, s.topic_requests, [
            (ids["ok1"], _request(ids["ok1"])),
            (ids["prm"], _request(ids["prm"], prompt=f"say {mark}")),
            # a submit time far outside datetime's range must not make the row unbuildable
            (ids["far"], _request(ids["far"], submitted_at=1e300)),
            (ids["ok2"], _request(ids["ok2"])),
        ])
        _publish(s, s.topic_results, [
            (ids["ok1"], _final(ids["ok1"])),
            (ids["out"], _final(ids["out"], text_=f"the model said {mark}")),  # output refused
            (ids["prm"], _final(ids["prm"])),
            (ids["wrk"], _final(ids["wrk"], worker=f"host-{mark}")),  # worker column refused
            (ids["ok2"], _final(ids["ok2"])),
            (ids["ok3"], _final(ids["ok3"])),
            (ids["far"], _final(ids["far"])),
        ])
        rows = wait_rows(store, ids.values(), timeout=30)
        assert set(rows) == set(ids.values())
        deadline = time.monotonic() + 20  # the requests topic may be read after the results
        while rows[ids["ok1"]].prompt is None or rows[ids["far"]].prompt is None:
            assert time.monotonic() < deadline, "queued rows not recorded"
            time.sleep(0.05)
            rows = store.get_requests(ids.values())
        for name in ("ok1", "ok2", "ok3", "prm", "far"):
            assert (rows[ids[name]].status, rows[ids[name]].output) == ("completed", "fine"), name
        assert rows[ids["ok1"]].prompt == "hello"
        assert rows[ids["prm"]].prompt is None           # the refused prompt is not stored
        assert rows[ids["far"]].prompt == "hello" and rows[ids["far"]].created_at is not None
        for name in ("out", "wrk"):
            row = rows[ids[name]]
            assert (row.status, row.error_code, row.finish_reason) == (
                "failed", "store_rejected", "error"), name
            assert "refused" in row.error and "test trigger" in row.error, row.error
            assert row.output is None
        assert rows[ids["out"]].worker == "w1" and rows[ids["out"]].usage["completion_tokens"] == 2
        assert rows[ids["wrk"]].worker is None           # the bare stand-in: id, status, error
        assert recorder.recorder.metrics["rows_refused"] >= 3

        # a redo's final (a worker crashed after the first) never replaces the error row
        received = recorder.recorder.metrics["received"]
        _publish(s, s.topic_results, [(ids["out"], _final(ids["out"], text_="redo"))])
        deadline = time.monotonic() + 20
        while recorder.recorder.metrics["received"] == received:
            assert time.monotonic() < deadline, "the recorder did not read the redo"
            time.sleep(0.05)
        row = store.get_request(ids["out"])
        assert (row.status, row.error_code, row.output) == ("failed", "store_rejected", None)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # a Kafka bug: one backend
def test_records_with_odd_headers_are_recorded_and_neighbours_too(recorder):
    """A header key that is not UTF-8 made kafka-python raise CorruptRecordError inside
    poll() at every restart; a null header value must pass too. Produced byte by byte, as
    a non-Python producer may."""
    s, store = recorder.settings, recorder.store
    tag = uuid.uuid4().hex[:8]
    ids = [f"hdr{i}-{tag}" for i in range(4)]
    bad_key = [(b"trace-\xff\xfe", b"1")]
    null_value = [("trace", None)]
    produce_raw(s.kafka_bootstrap, s.topic_requests, 0, [
        (ids[0].encode(), _request(ids[0]), [("ok", b"1")]),
        (ids[1].encode(), _request(ids[1]), bad_key),
        (ids[2].encode(), _request(ids[2]), null_value),
        (ids[3].encode(), _request(ids[3]), bad_key + null_value),
    ])
    produce_raw(s.kafka_bootstrap, s.topic_results, 0, [
        (ids[1].encode(), _final(ids[1]), bad_key + null_value),
        (ids[0].encode(), _final(ids[0]), []),
        (ids[2].encode(), _final(ids[2]), null_value),
    ])
    rows = wait_rows(store, ids[:3], timeout=30)
    assert {rid: rows[rid].status for rid in ids[:3]} == dict.fromkeys(ids[:3], "completed")
    row = wait_rows(store, [ids[3]], final=False, timeout=10)[ids[3]]
    assert (row.status, row.prompt) == ("queued", "hello")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the recorder's loop: one backend
def test_a_record_that_raises_is_skipped_and_the_others_recorded(recorder, monkeypatch):
    """Any exception while turning one record into a row (a bug, a value nothing expected)
    is logged and counted; the records around it are recorded and the loop goes on."""
    import inflight.consumers.recorder as recorder_module

    s, store = recorder.settings, recorder.store
    tag = uuid.uuid4().hex[:8]
    ok1, bad, ok2, later = (f"{n}-{tag}" for n in ("ok1", "bad", "ok2", "later"))
    real = recorder_module.final_row

    def final_row(event):
        if event.request_id == bad:
            raise RuntimeError("a bug that only this record meets")
        return real(event)

    monkeypatch.setattr(recorder_module, "final_row", final_row)
    _publish(s, s.topic_results, [(ok1, _final(ok1)), (bad, _final(bad)), (ok2, _final(ok2))])
    rows = wait_rows(store, [ok1, ok2], timeout=30)
    assert rows[ok1].status == rows[ok2].status == "completed"
    assert store.get_request(bad) is None and recorder.recorder.metrics["records_skipped"] == 1
    _publish(s, s.topic_results, [(later, _final(later))])
    assert wait_rows(store, [later], timeout=30)[later].status == "completed"

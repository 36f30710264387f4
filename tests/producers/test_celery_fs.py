"""The embedded Celery transport: messages appear whole or not at all."""

from __future__ import annotations

from kombu import Connection

from inflight.producers.celery_app import broker_options, celery_app
from inflight.producers.celery_fs import TRANSPORT
from inflight.schemas import Settings


def test_unfinished_message_files_are_skipped_and_messages_round_trip(tmp_path):
    settings = Settings(data_dir=tmp_path, celery_queue="q1")
    url, transport, options = broker_options(settings)
    assert transport == TRANSPORT and url == "filesystem://localhost/"
    folder = tmp_path / "celery" / "queue"
    # what kombu's own writer leaves for a moment: a named message file with no bytes yet
    (folder / "1_x.q1.msg.part").write_bytes(b"")
    with Connection(url, transport=transport, transport_options=options) as conn:
        queue = conn.SimpleQueue("q1")
        queue.put({"n": 1})
        assert not list(folder.glob("*.part"))[1:]  # only the stale one above
        assert queue.get(timeout=2).payload == {"n": 1}
        queue.close()
    assert (tmp_path / "celery" / "control").is_dir()  # not ./control in the working dir


def test_apps_use_json_only_and_no_result_backend(tmp_path):
    app = celery_app(Settings(data_dir=tmp_path))
    assert app.conf.accept_content == ["json"] and app.conf.task_serializer == "json"
    assert app.conf.task_ignore_result and app.conf.task_acks_late
    redis_app = celery_app(Settings(data_dir=tmp_path, celery_broker="redis://127.0.0.1:6379/0"))
    assert redis_app.conf.broker_url.startswith("redis://") and redis_app.conf.broker_transport is None

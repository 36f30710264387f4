"""A group that never wedges, on the real embedded broker.

On Tansu, a member that sends LeaveGroup while another member's join is under way wedges
the group for good: the joiner is told to follow the departed leader and never gets a
partition (neither does anyone joining later, nor a member that rejoins as a new one). A
member whose session expires instead is handled. So the worker closes its group consumer
without leaving (consumers.kafka_io.close_without_leaving).

Here: bare group consumers close that way at every moment of a join (fast), then a few
rounds of the worker-level faults (tests/consumers/group_rounds.py: worker processes,
recorder, SQLite); benchmarks/group_recovery.py runs many more rounds.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.consumers.conftest import make_settings

pytestmark = [pytest.mark.broker]


@pytest.mark.parametrize("delay", [0.0, 0.3, 0.7])
def test_a_member_closing_during_a_join_leaves_the_group_able_to_assign(broker, tmp_path,
                                                                       delay):
    from inflight.consumers.kafka_io import close_without_leaving, group_consumer

    settings = make_settings(broker, f"sqlite:///{tmp_path / 'x.db'}", partitions=2)
    topics = [settings.topic_requests]
    a = group_consumer(settings, settings.worker_group)
    a.subscribe(topics)
    deadline = time.monotonic() + 30
    while not a.assignment():
        a.poll(timeout_ms=50)
        assert time.monotonic() < deadline, "the first member was never assigned"
    b = group_consumer(settings, settings.worker_group)
    b.subscribe(topics)
    stop = threading.Event()

    def poll_b():
        while not stop.is_set():
            b.poll(timeout_ms=50)

    t = threading.Thread(target=poll_b, daemon=True)
    t.start()
    try:
        end = time.monotonic() + delay          # B's join is under way: A goes now
        while time.monotonic() < end:
            a.poll(timeout_ms=20)
        close_without_leaving(a)
        deadline = time.monotonic() + 20        # A's session (2 s) expires, B takes over
        while len(b.assignment()) < 2:
            assert time.monotonic() < deadline, f"B wedged: assigned {b.assignment()}"
            time.sleep(0.05)
    finally:
        stop.set()
        t.join(10)
        b.close()


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["sigterm_join", "kill_in_rebalance"])
def test_worker_group_faults_lose_nothing(broker, tiny_model, tmp_path, scenario):
    from tests.consumers.group_rounds import run_round

    r = run_round(broker, tiny_model, tmp_path / scenario, scenario, rnd=0, seed=7,
                  deadline_s=120)
    assert r.ok, f"{r.detail} {r.notes}"

"""A gone machine's RabbitMQ connections are closed by its user, so its unacknowledged jobs are
requeued at once; another machine's connections and jobs stay as they are.

Real RabbitMQ with its management API; real per-machine users (`rabbit_users.create_user`) and
kombu consumers holding unacknowledged messages (acks late).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from kombu import Connection, Consumer, Queue

from autoscaler.brokers.rabbitmq import users as rabbit_users
from autoscaler.brokers.users import create_user, plan_for
from autoscaler.config.metrics_sources import CelerySource
from tests.conftest import AMQP_URL

MGMT = "http://127.0.0.1:15672"
AUTH = ("guest", "guest")


def connections_of(user: str) -> list[dict[str, Any]]:
    resp = requests.get(f"{MGMT}/api/connections/username/{user}", auth=AUTH, timeout=5)
    resp.raise_for_status()
    return list(resp.json())


class Machine:
    """A consumer connected as `user` holding `n` unacknowledged messages of `queue`, plus
    `extra` idle connections (a Celery worker holds several)."""

    def __init__(self, url: str, queue: str, n: int, extra: int = 0) -> None:
        self.conn = Connection(url, heartbeat=0)
        self.others = [Connection(url, heartbeat=0) for _ in range(extra)]
        for other in self.others:
            other.connect()
        self.held: list[Any] = []
        ch = self.conn.channel()
        ch.basic_qos(0, n, False)
        self.consumer = Consumer(
            ch,
            [Queue(queue, no_declare=True)],
            no_ack=False,
            callbacks=[lambda body, m: self.held.append(m)],
        )
        self.consumer.consume()
        deadline = time.monotonic() + 10
        while len(self.held) < n:
            assert time.monotonic() < deadline, "the consumer got too little"
            self.conn.drain_events(timeout=5)

    def ids(self) -> set[str]:
        return {str(m.properties["correlation_id"]) for m in self.held}

    def close(self) -> None:
        for c in (self.conn, *self.others):
            with contextlib.suppress(Exception):  # closed by the broker already
                c.release()


@pytest.fixture
def queue_and_users() -> Iterator[tuple[rabbit_users.RabbitPlan, str, str, str]]:
    install = f"t{uuid.uuid4().hex[:10]}"
    queue = f"rc-{uuid.uuid4().hex[:8]}"
    plan = plan_for(CelerySource(url=AMQP_URL, management_url=MGMT), queue)
    assert isinstance(plan, rabbit_users.RabbitPlan)
    a, b = plan.user(install, "la"), plan.user(install, "lb")
    for user in (a, b):
        create_user(plan, user, "pw-" + user)
    with Connection(AMQP_URL) as admin:
        Queue(queue, durable=True).bind(admin.channel()).declare()
    try:
        yield plan, queue, a, b
    finally:
        for user in (a, b):
            rabbit_users.delete_user(plan, user)
        requests.delete(f"{MGMT}/api/queues/%2F/{queue}", auth=AUTH, timeout=5)


def publish(queue: str, n: int) -> list[str]:
    ids = [str(uuid.uuid4()) for _ in range(n)]
    with Connection(AMQP_URL) as admin:
        prod = admin.Producer()
        for i in ids:
            prod.publish({"id": i}, routing_key=queue, correlation_id=i, delivery_mode=2)
    return ids


def take(queue: str, want: int, timeout: float) -> list[Any]:
    """What a fresh consumer (the broker's admin) can get from the queue within `timeout`."""
    got: list[Any] = []
    with Connection(AMQP_URL) as conn:
        q = Queue(queue, no_declare=True).bind(conn.channel())
        deadline = time.monotonic() + timeout
        while len(got) < want and time.monotonic() < deadline:
            m = q.get(no_ack=False)
            if m is None:
                time.sleep(0.02)
                continue
            got.append(m)
        for m in got:
            m.ack()
    return got


def test_closing_a_users_connections_requeues_its_jobs_at_once(queue_and_users):
    plan, queue, a, b = queue_and_users
    publish(queue, 4)
    machine_a = Machine(plan.machine_url(a, "pw-" + a), queue, 2, extra=1)
    machine_b = Machine(plan.machine_url(b, "pw-" + b), queue, 2)
    try:
        assert take(queue, 1, 0.3) == []  # all four held, none ready
        assert len(connections_of(a)) == 2 and len(connections_of(b)) == 1
        started = time.monotonic()
        assert rabbit_users.close_connections(plan, a, "machine gone at its provider") == 2

        back = take(queue, 3, 2.0)  # A's two come back at once; B's stay with B
        assert {m.properties["correlation_id"] for m in back} == machine_a.ids()
        assert time.monotonic() - started < 3.0
        assert all(m.delivery_info["redelivered"] for m in back)
        assert len(connections_of(b)) == 1

        for m in machine_b.held:  # B's connection still works: its acks go through
            m.ack()
        machine_b.close()
        assert take(queue, 1, 0.5) == []  # (a failed ack would have requeued them at close)
        # the jobs came back while A's clients never answered the close (a dead machine never
        # does); the broker lists its connections until they do, or for up to 30s
        for c in (machine_a.conn, *machine_a.others):
            with pytest.raises(Exception, match="CONNECTION_FORCED - machine gone"):
                c.drain_events(timeout=5)
        deadline = time.monotonic() + 10
        while connections_of(a):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert rabbit_users.close_connections(plan, a, "again") == 0  # nothing left of A
    finally:
        machine_a.close()
        machine_b.close()


def test_the_client_is_told_why_and_nothing_else(queue_and_users):
    plan, queue, a, _ = queue_and_users
    publish(queue, 1)
    machine = Machine(plan.machine_url(a, "pw-" + a), queue, 1)
    try:
        assert rabbit_users.close_connections(plan, a, "gone: lease ended\r\nX-Evil: 1") == 1
        with pytest.raises(Exception, match=r"CONNECTION_FORCED - gone: lease ended\?\?X-Evil"):
            machine.conn.drain_events(timeout=5)
        assert {m.properties["correlation_id"] for m in take(queue, 1, 5.0)} == machine.ids()
    finally:
        machine.close()


def test_deleting_the_user_closes_its_connections_too(queue_and_users):
    """RabbitMQ (3.10 here) closes a deleted user's connections itself: the destroy path's
    `delete_user` requeues too, and a later `close_connections` finds nothing."""
    plan, queue, a, _ = queue_and_users
    publish(queue, 1)
    machine = Machine(plan.machine_url(a, "pw-" + a), queue, 1)
    try:
        rabbit_users.delete_user(plan, a)
        with pytest.raises(Exception, match="is deleted"):
            machine.conn.drain_events(timeout=5)
        assert {m.properties["correlation_id"] for m in take(queue, 1, 5.0)} == machine.ids()
        assert rabbit_users.close_connections(plan, a, "gone") == 0
    finally:
        machine.close()

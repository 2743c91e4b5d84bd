"""Celery on the real RabbitMQ: management API numbers, passive declare fallback, secrets.

The management plugin must listen on 127.0.0.1:15672 (`rabbitmq-plugins enable
rabbitmq_management`; .ci/run does it). Its statistics are sampled every ~5 s, so the tests
poll until the broker reports what they did (bounded), they never sleep a fixed time.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import amqp
import pytest
import requests
from celery import Celery

from autoscaler.brokers import stamp
from autoscaler.brokers.base import SourceError
from autoscaler.brokers.fallback import FallbackReader
from autoscaler.brokers.rabbitmq.celery_rabbitmq import CeleryRabbitMQReader
from autoscaler.policy.snapshot import QueueMetrics
from tests.brokers.conftest import SECRET, free_port
from tests.brokers.helpers import uninstall_stamp
from tests.conftest import AMQP_URL

MGMT = "http://127.0.0.1:15672"


@pytest.fixture(scope="module", autouse=True)
def management_api() -> None:
    try:
        requests.get(f"{MGMT}/api/overview", auth=("guest", "guest"), timeout=3).raise_for_status()
    except requests.RequestException:
        pytest.fail(
            "RabbitMQ management API is not on 127.0.0.1:15672: run "
            "`rabbitmq-plugins enable rabbitmq_management`"
        )


@pytest.fixture
def channel() -> Iterator[amqp.Channel]:
    conn = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest")
    conn.connect()
    yield conn.channel()
    conn.close()


@pytest.fixture
def queue(channel) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:12]}"
    yield name
    c = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest")
    c.connect()
    c.channel().queue_delete(name)
    c.close()


def wait_for(read: Callable[[], QueueMetrics], ok: Callable[[QueueMetrics], bool]) -> QueueMetrics:
    deadline = time.monotonic() + 20
    while True:
        got = read()
        if ok(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.25)


def test_management_numbers_ready_unacked_and_head_age_of_stamped_tasks(queue, channel):
    stamp.install()
    try:
        app = Celery("producer", broker=AMQP_URL, set_as_current=False)
        t0 = time.time()
        for _ in range(3):
            app.send_task("t.x", queue=queue)
        app.close()
    finally:
        uninstall_stamp()
    deadline = time.monotonic() + 10  # publishes on another connection land asynchronously
    held = None
    while held is None and time.monotonic() < deadline:
        held = channel.basic_get(queue, no_ack=False)  # one delivered, not acked
    assert held is not None
    clock = datetime.fromtimestamp(t0 + 100, UTC)
    reader = CeleryRabbitMQReader(AMQP_URL, management_url=MGMT, clock=lambda: clock)
    got = wait_for(
        lambda: reader.read([queue])[queue],
        lambda m: (m.pending, m.in_flight) == (2, 1) and (m.oldest_pending_age or 0.0) >= 98,
    )  # the stamp, once stats show it
    assert (got.pending, got.in_flight, got.stale) == (2, 1, False)
    assert got.oldest_pending_age is not None and 98 <= got.oldest_pending_age <= 101
    channel.basic_ack(held.delivery_tag)


def test_missing_queue_is_empty_and_a_new_queue_is_counted_before_its_statistics(channel):
    name = f"t-{uuid.uuid4().hex[:12]}"
    reader = CeleryRabbitMQReader(AMQP_URL, management_url=MGMT)
    m = reader.read([name])[name]
    assert (m.pending, m.stale) == (0, False)
    channel.queue_declare(name, auto_delete=False)
    try:
        for _ in range(4):
            channel.basic_publish(amqp.Message(b"x"), routing_key=name)
        # read at once: the management database has no statistics for it yet
        m = reader.read([name])[name]
        assert (m.pending, m.stale) == (4, False)
    finally:
        channel.queue_delete(name)


def test_management_down_falls_back_to_passive_declare(queue, channel, caplog):
    channel.queue_declare(queue, auto_delete=False)
    channel.basic_publish(amqp.Message(b"x"), routing_key=queue)
    mgmt = f"http://guest:{SECRET}@127.0.0.1:{free_port()}"  # nothing listens there
    reader = CeleryRabbitMQReader(AMQP_URL, management_url=mgmt, timeout=2)
    m = wait_for(lambda: reader.read([queue])[queue], lambda m: m.pending == 1)
    # the ready count is fresh (scale-up from zero keeps working); the error says what is missing
    assert m.pending == 1 and not m.stale and m.error and "passive declare" in m.error
    assert m.in_flight == 0 and m.oldest_pending_age is None
    assert SECRET not in m.error
    fb = FallbackReader(reader, max_age=60).read([queue])[queue]
    assert (fb.pending, fb.stale) == (1, False)
    assert SECRET not in caplog.text


def test_wrong_credentials_everywhere_is_a_redacted_error_and_a_stale_reading(queue):
    url = f"amqp://guest:{SECRET}@127.0.0.1:5672//"
    reader = CeleryRabbitMQReader(url, management_url=MGMT, timeout=3)
    with pytest.raises(SourceError) as err:
        reader.read([queue])
    assert SECRET not in str(err.value) and "401" in str(err.value)
    now = datetime.now(UTC)
    got = FallbackReader(reader, max_age=60, clock=lambda: now + timedelta(0)).read([queue])[queue]
    assert got.stale and got.pending == 0 and SECRET not in (got.error or "")

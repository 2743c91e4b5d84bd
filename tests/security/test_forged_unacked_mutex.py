"""A forged kombu `unacked_mutex` stops no restore for long (issue: "A forged `unacked_mutex`
stops every hand-back of the domain, and kombu's own restore").

On real Redis 7: a machine's own broker user (its ACL as `brokers.users` makes it) sets
the domain's mutex with no expiry. A real kombu consumer's `restore_visible` then restores
nothing, for as long as the key lives; the reconcile round's sweep deletes it (and only a
mutex kombu cannot have set), after which kombu's restore works again.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from kombu import Connection

from autoscaler.brokers import users as broker_users
from autoscaler.brokers.redis.keys import CeleryRedisLayout
from autoscaler.brokers.redis.unacked_mutex import KOMBU_MUTEX_EXPIRE, clear_forged, forged_why
from autoscaler.config import Config, load_config_text
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.control.steps.handback import sweep_forged_mutexes
from autoscaler.settings import Settings
from autoscaler.store import config_versions, migrate
from tests.conftest import REDIS_URL

BROKER = f"{REDIS_URL}/0"


@pytest.fixture
def prefix() -> str:
    return f"fm-{uuid.uuid4().hex[:8]}:"


@pytest.fixture
def admin(prefix):
    client = redis.Redis.from_url(BROKER)
    yield client
    for key in client.scan_iter(match=prefix + "*"):
        client.delete(key)
    client.close()


def _config(prefix: str, queue: str) -> Config:
    return load_config_text(
        f"""
providers:
  gpu: {{kind: mock}}
queues:
  {queue}:
    metrics: {{source: celery, url: "{BROKER}", global_keyprefix: "{prefix}"}}
    autoscale:
      provider: gpu
      max_workers: 1
      instance: {{gpu: "RTX 4090", max_price_per_hour: 1}}
"""
    )


def _machine_client(prefix: str, queue: str) -> tuple[redis.Redis, str]:
    """A connection as a rented machine of `queue` holds it: its own ACL user."""
    plan = broker_users.plan_for(_config(prefix, queue).queues[queue].metrics, queue, {})
    user, password = f"fm-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    broker_users.create_user(plan, user, password)
    return redis.Redis.from_url(broker_users.machine_url(BROKER, user, password)), user


def _runtime(tmp_path: Path, db_url: str, prefix: str, queue: str) -> Runtime:
    migrate.upgrade(db_url)
    env = {"AUTOSCALER_HOME": str(tmp_path), "AUTOSCALER_DATABASE_URL": db_url}
    rt = Runtime(Settings.from_env(env), env=env)
    config = _config(prefix, queue)
    with rt.transaction() as session:
        config_versions.record(session, config.model_dump(mode="json"), "t", utc_now())
    return rt


def _expired_delivery(prefix: str, queue: str) -> Connection:
    """A message delivered to a consumer that died: in kombu's unacked hash, past a 1 s
    visibility timeout. Returns a live consumer connection of the same domain."""
    opts = {"global_keyprefix": prefix, "visibility_timeout": 1}
    with Connection(BROKER, transport_options=opts) as conn:
        conn.SimpleQueue(queue).put({"job": 1})
        dead = conn.channel()
        dead.basic_qos(0, 1, False)
        message = dead.basic_get(queue, no_ack=False)
        assert message is not None  # delivered, never acked: the consumer "dies"
        dead.qos._delivered.clear()  # no restore at close: a killed process says nothing
    time.sleep(1.2)
    return Connection(BROKER, transport_options=opts)


@pytest.mark.timeout(60)
def test_a_mutex_a_machine_set_without_expiry_is_cleared_and_kombus_restore_works_again(
    tmp_path, db_url, prefix, admin
):
    queue = f"fmq-{uuid.uuid4().hex[:6]}"
    rt = _runtime(tmp_path, db_url, prefix, queue)
    machine, user = _machine_client(prefix, queue)
    try:
        assert machine.set(prefix + "unacked_mutex", "mine")  # its ACL allows SET: no expiry
    finally:
        machine.close()
        admin.acl_deluser(user)
    consumer = _expired_delivery(prefix, queue)
    try:
        channel = consumer.default_channel
        channel.qos.restore_visible(num=10, interval=1)  # kombu's own sweep
        assert admin.llen(prefix + queue) == 0  # held off by the forged mutex
        (text,) = sweep_forged_mutexes(rt)
        assert "no expiry" in text and admin.exists(prefix + "unacked_mutex") == 0
        channel.qos.restore_visible(num=10, interval=1)
        assert admin.llen(prefix + queue) == 1  # kombu restored it
    finally:
        consumer.release()
    assert sweep_forged_mutexes(rt) == []  # nothing more to clear


@pytest.mark.parametrize(
    ("value", "px", "kept"),
    [
        (uuid.uuid1().hex, int(KOMBU_MUTEX_EXPIRE * 1000), True),  # what kombu sets
        (uuid.uuid1().hex, 10 * 3600 * 1000, False),  # ten hours: not kombu's
        ("mine", 1000, False),  # no lock token
    ],
    ids=["kombus", "ten-hours", "no-token"],  # fixed: xdist workers must collect the same ids
)
def test_only_a_mutex_kombu_cannot_have_set_is_deleted(prefix, admin, value, px, kept):
    admin.set(prefix + "unacked_mutex", value, px=px)
    why = clear_forged(admin, CeleryRedisLayout(global_keyprefix=prefix))
    assert (why is None) == kept
    assert admin.exists(prefix + "unacked_mutex") == int(kept)


@given(
    ttl=st.integers(min_value=-1, max_value=10**9),
    value=st.one_of(st.binary(max_size=40), st.just(uuid.uuid1().hex.encode())),
)
def test_forged_is_exactly_what_kombus_mutex_never_is(ttl, value):
    why = forged_why(ttl, value)
    token = len(value) == 32 and all(c in b"0123456789abcdef" for c in value)
    kombus = 0 <= ttl <= KOMBU_MUTEX_EXPIRE * 1000 and token
    assert (why is None) == kombus

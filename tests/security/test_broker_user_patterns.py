"""A machine's broker user reaches its own database and its own queue's names, literally.

- A queue named `render*` was accepted and its user read `render-private-queue` and
  `renderer:api_key`: names went into ACL patterns unescaped. They are escaped now (`* ? [ ] \\`).
- `SELECT` was granted, and ACL key patterns are not tied to a database: the user reached
  every other database's keys of the same names. It may now select its own database only (none
  at all on database 0).
Against the real Redis 7 of the suite, with the user `broker_users.create_user` makes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from autoscaler.brokers.users import BrokerPlan, create_user, delete_user
from tests.conftest import REDIS_URL


@pytest.fixture
def user() -> Iterator[str]:
    name = f"asg-test{uuid.uuid4().hex[:8]}-patterns"
    try:
        yield name
    finally:
        delete_user(f"{REDIS_URL}/0", name)


def _as(user: str, db: int) -> redis.Redis:
    return redis.Redis.from_url(f"{REDIS_URL}/{db}", username=user, password="pw-" + user)


def test_a_queue_named_with_glob_characters_opens_its_own_keys_only(user):
    admin = redis.Redis.from_url(f"{REDIS_URL}/3")
    prefix = f"t{uuid.uuid4().hex[:6]}["  # a prefix with a glob character too
    own, private, secret = (
        f"{prefix}render*",
        f"{prefix}render-private-queue",
        f"{prefix}renderer:api_key",
    )
    try:
        admin.rpush(own, "job")
        admin.rpush(private, "someone else's job")
        admin.set(secret, "sk-live-123")
        plan = BrokerPlan(
            url=f"{REDIS_URL}/3", queue="render*", db=3, keyprefix=prefix, sep="\x06\x16"
        )
        create_user(plan, user, "pw-" + user)
        machine = _as(user, 3)
        assert machine.llen(own) == 1  # its own queue, named literally
        for key, read in ((private, lambda k: machine.lrange(k, 0, -1)), (secret, machine.get)):
            with pytest.raises(redis.exceptions.NoPermissionError):
                read(key)
        machine.close()
    finally:
        admin.delete(own, private, secret)
        admin.close()


@pytest.mark.parametrize("db", [0, 5])
def test_the_user_selects_its_own_database_only(user, db):
    plan = BrokerPlan(url=f"{REDIS_URL}/{db}", queue="q", db=db, keyprefix="", sep="\x06\x16")
    create_user(plan, user, "pw-" + user)
    machine = _as(user, db)  # redis-py selects the URL's database (none for 0) as it connects
    try:
        assert machine.llen("q") == 0
        for other in (0, 1, 12, 15):
            if other == db:
                continue
            with pytest.raises(redis.exceptions.NoPermissionError):
                machine.execute_command("SELECT", other)
    finally:
        machine.close()


def test_validate_lists_each_trust_domain_and_what_its_machines_hold():
    """Two queues on one database and prefix share kombu's unacked hash and bindings: `validate`
    says so, and a queue with its own prefix is its own domain; queues of one prefix on two
    databases are one domain (a database is no boundary), and it says that. No URL is printed."""
    from autoscaler.brokers.users import machine_access
    from autoscaler.config import load_config_text

    def queue(name: str, prefix: str = "", db: int = 4) -> str:
        extra = f", global_keyprefix: '{prefix}'" if prefix else ""
        return f"""
  {name}:
    metrics: {{source: celery, url: "redis://:pw-secret@127.0.0.1:6379/{db}"{extra}}}
    autoscale:
      provider: gpu
      max_workers: 1
      instance: {{gpu: RTX 4090, max_price_per_hour: 0.6}}"""

    config = load_config_text(
        "providers: {gpu: {kind: mock}}\nqueues:"
        + queue("render")
        + queue("train")
        + queue("billing", "billing:")
    )
    lines = machine_access(config)
    text = "\n".join(lines)
    assert "trust domain 127.0.0.1:6379 holds queues render, train" in text
    assert "disturb each other's in-flight jobs" in text
    assert "trust domain 127.0.0.1:6379 prefix 'billing:' holds queue billing alone" in text
    assert "--without-mingle" in text and "pw-secret" not in text
    # the same prefix on another database: the same domain, and said to be
    config = load_config_text(
        "providers: {gpu: {kind: mock}}\nqueues:" + queue("a") + queue("b", db=5)
    )
    text = "\n".join(machine_access(config))
    assert "trust domain 127.0.0.1:6379 holds queues a, b on databases 4, 5" in text
    assert "a database is no boundary" in text


def test_no_user_is_made_for_a_queue_whose_exchange_routes_to_other_queues():
    """The `celery` queue's machine copied other queues' messages by adding a binding to
    `_kombu.binding.celery`, the default exchange many queues share. Such a queue gets no
    per-machine user (with the reason and the fix), unless its metrics block accepts it."""
    from autoscaler.brokers.users import NoBrokerUser, plan_for
    from autoscaler.config.metrics_sources import CelerySource

    prefix = f"t{uuid.uuid4().hex[:6]}:"
    admin = redis.Redis.from_url(f"{REDIS_URL}/6")
    key = f"{prefix}_kombu.binding.celery"
    try:
        admin.sadd(key, "celery\x06\x16\x06\x16celery")
        source = CelerySource(url=f"{REDIS_URL}/6", global_keyprefix=prefix)
        assert plan_for(source, "celery").queue == "celery"  # its exchange is its own so far
        admin.sadd(key, "reports\x06\x16\x06\x16reports")  # another queue bound to it
        with pytest.raises(NoBrokerUser, match="also routes to reports") as info:
            plan_for(source, "celery")
        assert "shared_exchange: accept" in str(info.value)
        accepted = source.model_copy(update={"shared_exchange": "accept"})
        assert plan_for(accepted, "celery").queue == "celery"
    finally:
        admin.delete(key)
        admin.close()

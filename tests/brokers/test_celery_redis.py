"""Celery on Redis against the real server: layouts Celery itself produces, ages, in flight."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import redis
from celery import Celery
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kombu import Connection

from autoscaler.brokers import stamp
from autoscaler.brokers.base import SourceError
from autoscaler.brokers.fallback import FallbackReader
from autoscaler.brokers.redis.celery_redis import CeleryRedisReader
from autoscaler.brokers.redis.keys import CeleryRedisLayout
from autoscaler.store.db import session_factory
from autoscaler.store.head_sightings import StoredSightings
from tests.brokers.conftest import SECRET
from tests.brokers.helpers import envelope, unacked_entry, uninstall_stamp
from tests.conftest import REDIS_URL


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def producer(prefix: str, **opts) -> Celery:
    app = Celery("producer", broker=f"{REDIS_URL}/0", set_as_current=False)
    app.conf.broker_transport_options = {"global_keyprefix": prefix, **opts}
    return app


def test_depth_sums_every_priority_key_with_prefix_custom_sep_and_steps(prefix, rclient):
    app = producer(prefix, sep=":p:", priority_steps=[0, 2, 5])
    for pri, n in ((0, 2), (3, 3), (5, 1), (9, 4)):
        for _ in range(n):
            app.send_task("t.x", queue="jobs", priority=pri)
    app.close()
    # Celery put them where kombu's layout says; our layout names the same keys
    layout = CeleryRedisLayout(global_keyprefix=prefix, sep=":p:", priority_steps=(0, 2, 5))
    assert {k.decode() for k in rclient.keys(f"{prefix}jobs*")} == set(layout.keys("jobs"))
    reader = CeleryRedisReader(f"{REDIS_URL}/0", layout=layout)
    got = reader.read(["jobs", "other"])
    assert got["jobs"].pending == 10
    assert got["other"].pending == 0 and got["other"].oldest_pending_age is None
    # the default layout would miss the custom-separator keys: the options matter
    wrong = CeleryRedisReader(f"{REDIS_URL}/0", layout=CeleryRedisLayout(global_keyprefix=prefix))
    assert wrong.read(["jobs"])["jobs"].pending == 2
    # and without the prefix nothing is found
    assert CeleryRedisReader(f"{REDIS_URL}/0").read([f"{uuid.uuid4()}"]).popitem()[1].pending == 0


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(st.integers(0, 9), min_size=1, max_size=5, unique=True).map(
        lambda s: tuple(sorted(s))
    ),
    sep=st.sampled_from(["\x06\x16", ":", "|pri|"]),
    counts=st.dictionaries(
        st.sampled_from(["a", "b", "c"]),
        st.lists(st.integers(0, 4), min_size=5, max_size=5),
        max_size=3,
    ),
)
def test_depth_is_the_sum_over_priority_keys_for_random_layouts(
    prefix, rclient, steps, sep, counts
):
    sub = f"{prefix}{uuid.uuid4().hex[:6]}:"
    layout = CeleryRedisLayout(global_keyprefix=sub, sep=sep, priority_steps=steps)
    expected = {}
    pipe = rclient.pipeline()
    for q, per_key in counts.items():
        keys = layout.keys(q)
        expected[q] = sum(per_key[: len(keys)])
        for key, n in zip(keys, per_key, strict=False):
            for _ in range(n):
                pipe.lpush(key, envelope(q))
    pipe.execute()
    # noise that must not be counted: another prefix, a step not configured
    rclient.lpush(f"{sub}x:a", envelope("a"))
    rclient.lpush(f"{sub}a{sep}10", envelope("a"))
    got = CeleryRedisReader(f"{REDIS_URL}/0", layout=layout).read(["a", "b", "c"])
    assert {q: m.pending for q, m in got.items()} == {q: expected.get(q, 0) for q in "abc"}


def test_stamped_producer_gives_the_oldest_age_over_all_priorities(prefix):
    stamp.install()
    try:
        app = producer(prefix)
        t0 = datetime.now(UTC).timestamp()
        app.send_task("t.x", queue="q", priority=9)  # oldest, in the lowest-priority key
        app.send_task("t.x", queue="q", priority=0)
        app.close()
    finally:
        uninstall_stamp()
    clock = Clock()
    clock.now = datetime.fromtimestamp(t0 + 120, UTC)
    got = CeleryRedisReader(
        f"{REDIS_URL}/0", layout=CeleryRedisLayout(global_keyprefix=prefix), clock=clock
    ).read(["q"])["q"]
    assert got.pending == 2
    assert got.oldest_pending_age is not None and 119 <= got.oldest_pending_age <= 121


def test_unstamped_age_is_bounded_from_first_sighting_and_survives_restart(prefix, engine):
    app = producer(prefix)
    app.send_task("t.x", queue="q")
    app.send_task("t.x", queue="q")
    app.close()
    url = f"{REDIS_URL}/0"
    layout = CeleryRedisLayout(global_keyprefix=prefix)
    clock = Clock()
    store = StoredSightings(session_factory(engine))
    first = CeleryRedisReader(url, layout=layout, sightings=store, clock=clock)
    assert first.read(["q"])["q"].oldest_pending_age == 0.0
    clock.advance(50)
    assert first.read(["q"])["q"].oldest_pending_age == 50.0
    # a restart: new reader, new store object, same database -> the bound keeps growing
    clock.advance(10)
    again = CeleryRedisReader(
        url, layout=layout, clock=clock, sightings=StoredSightings(session_factory(engine))
    )
    assert again.read(["q"])["q"].oldest_pending_age == 60.0
    # the head is consumed: the next message was seen behind it from the first read on, so
    # its bound keeps the first sighting (not "now", which would reset on every pop)
    redis.Redis.from_url(url).rpop(f"{prefix}q")
    clock.advance(5)
    assert again.read(["q"])["q"].oldest_pending_age == 65.0
    # a message published now starts at zero once the older ones are gone
    redis.Redis.from_url(url).rpop(f"{prefix}q")
    producer(prefix).send_task("t.x", queue="q")
    clock.advance(5)
    assert again.read(["q"])["q"].oldest_pending_age == 0.0
    # without persistence the same restart would have reset the age
    memo = CeleryRedisReader(url, layout=layout, clock=clock)
    clock.advance(5)
    assert memo.read(["q"])["q"].oldest_pending_age == 0.0


def test_in_flight_counts_real_unacked_messages_by_routing_key(prefix):
    app = producer(prefix)
    for q, n in (("a", 3), ("b", 2)):
        for _ in range(n):
            app.send_task("t.x", queue=q)
    app.close()
    conn = Connection(f"{REDIS_URL}/0", transport_options={"global_keyprefix": prefix})
    held = []
    try:
        ch = conn.channel()
        for q, n in (("a", 2), ("b", 1)):
            held += [ch.basic_get(q, no_ack=False) for _ in range(n)]  # delivered, not acked
        assert all(m is not None for m in held)
        got = CeleryRedisReader(
            f"{REDIS_URL}/0", layout=CeleryRedisLayout(global_keyprefix=prefix)
        ).read(["a", "b"])
        assert (got["a"].pending, got["a"].in_flight) == (1, 2)
        assert (got["b"].pending, got["b"].in_flight) == (1, 1)
        for m in held:
            m.ack()
        got = CeleryRedisReader(
            f"{REDIS_URL}/0", layout=CeleryRedisLayout(global_keyprefix=prefix)
        ).read(["a", "b"])
        assert (got["a"].in_flight, got["b"].in_flight) == (0, 0)
    finally:
        conn.release()


def test_a_key_of_the_wrong_type_fails_that_queue_only(prefix, rclient):
    rclient.set(f"{prefix}broken", "x")
    rclient.lpush(f"{prefix}ok", envelope("ok"))
    rclient.hset(f"{prefix}unacked", "tag", unacked_entry("ok"))
    reader = CeleryRedisReader(f"{REDIS_URL}/0", layout=CeleryRedisLayout(global_keyprefix=prefix))
    got = reader.read(["broken", "ok"])
    assert got["broken"].stale and "WRONGTYPE" in (got["broken"].error or "")
    assert (got["ok"].pending, got["ok"].in_flight, got["ok"].stale) == (1, 1, False)


def test_wrong_password_is_a_redacted_source_error(private_redis, caplog):
    url = f"redis://:{SECRET}x@127.0.0.1:{private_redis.port}/0"
    reader = CeleryRedisReader(url)
    with pytest.raises(SourceError) as err:
        reader.read(["q"])
    assert SECRET not in str(err.value) and "127.0.0.1" in str(err.value)
    caplog.set_level(logging.DEBUG)
    got = FallbackReader(CeleryRedisReader(url), max_age=60).read(["q"])["q"]
    assert got.stale and got.pending == 0 and got.error
    assert SECRET not in got.error and SECRET not in repr(got) and SECRET not in caplog.text


def test_redis_going_away_mid_read_keeps_last_numbers_for_a_bounded_time(private_redis, caplog):
    caplog.set_level(logging.DEBUG)
    url = private_redis.url
    r = redis.Redis.from_url(url)
    for _ in range(3):
        r.lpush("q", envelope("q"))
    r.close()
    clock = Clock()
    reader = FallbackReader(CeleryRedisReader(url, clock=clock, timeout=1), max_age=60, clock=clock)
    good = reader.read(["q"])["q"]
    assert (good.pending, good.stale) == (3, False)
    private_redis.stop()  # the server goes away between ticks (pooled connection now dead)
    clock.advance(30)
    held = reader.read(["q"])["q"]
    assert held.stale and held.pending == 3 and held.read_at == good.read_at
    assert held.error and SECRET not in held.error
    clock.advance(31)  # past max_age: no numbers to act on, still never an exception
    gone = reader.read(["q"])["q"]
    assert gone.stale and gone.pending == 0 and gone.read_at == clock.now
    assert SECRET not in caplog.text
    private_redis.start()  # back (empty, no persistence): fresh numbers again
    back = FallbackReader(CeleryRedisReader(url), max_age=60).read(["q"])["q"]
    assert (back.pending, back.stale) == (0, False)


def test_secrets_never_appear_in_reader_identity(private_redis):
    reader = CeleryRedisReader(private_redis.url)
    assert SECRET not in reader.source_id and SECRET not in repr(reader.__dict__.get("source_id"))


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    layout=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.sampled_from([0, 3, 6, 9]),
            st.one_of(st.none(), st.floats(0, 5000)),
        ),
        max_size=12,
    ),
    noise=st.sampled_from([b"not json", b'{"headers": 3}', b"[1,2]", b'{"id": "x\\ty"}']),
)
def test_script_and_pipeline_modes_agree_on_every_layout(prefix, rclient, layout, noise):
    """The server-side script and the plain pipeline are two readings of the same keys: equal
    depth and equal age for any mix of stamped, unstamped and malformed heads."""
    sub = f"{prefix}{uuid.uuid4().hex[:6]}:"
    lay = CeleryRedisLayout(global_keyprefix=sub)
    t_now = datetime.now(UTC)
    for q, step, age in layout:
        key = lay.keys(q)[lay.steps.index(step)]
        stamp_at = None if age is None else t_now.timestamp() - age
        rclient.lpush(key, envelope(q, stamp=stamp_at))
    rclient.lpush(lay.keys("c")[0], noise)  # a head no JSON parser likes
    clock = Clock()
    clock.now = t_now
    script = CeleryRedisReader(f"{REDIS_URL}/0", layout=lay, clock=clock, mode="script")
    pipe = CeleryRedisReader(f"{REDIS_URL}/0", layout=lay, clock=clock, mode="pipeline")
    a, b = script.read(["a", "b", "c"]), pipe.read(["a", "b", "c"])
    for q in "abc":
        assert a[q].pending == b[q].pending
        assert (a[q].oldest_pending_age is None) == (b[q].oldest_pending_age is None)
        if a[q].oldest_pending_age is not None:
            assert abs(a[q].oldest_pending_age - b[q].oldest_pending_age) < 1e-3
    for q in "ab":  # the age is the oldest over the heads of the keys: a stamped head's own;
        # an unstamped head (first seen now) was published before every message behind it, so
        # it is at least as old as the oldest stamped one behind it
        per_key: dict[int, list[float | None]] = {}
        for qq, step, age in layout:
            if qq == q:
                per_key.setdefault(step, []).append(age)  # LPUSH: the first stays at the head
        ages = []
        for msgs in per_key.values():
            if msgs[0] is not None:
                ages.append(msgs[0])
            else:
                ages.append(max([0.0, *(x for x in msgs[1:] if x is not None)]))
        expect = max(ages, default=None)
        got = a[q].oldest_pending_age
        assert (got is None) == (expect is None)
        if got is not None:
            assert abs(got - expect) < 1e-3


def test_one_round_trip_for_all_queues_and_redis_dying_during_the_read(private_redis):
    url = private_redis.url
    admin = redis.Redis.from_url(url)
    queues = [f"q{i}" for i in range(200)]
    pipe = admin.pipeline()
    for q in queues[::3]:
        pipe.lpush(q, envelope(q))
        pipe.lpush(f"{q}\x06\x166", envelope(q))
    pipe.execute()
    reader = CeleryRedisReader(url, timeout=5)
    admin.script_flush()  # as after a server restart: the first read loads the script itself
    assert sum(m.pending for m in reader.read(queues).values()) == 2 * len(queues[::3])
    admin.config_resetstat()
    got = reader.read(queues)
    stats = admin.info("commandstats")
    calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()}
    # run by the script
    inside = (
        "llen",
        "exists",
        "lindex",
        "lrange",
        "zrange",
        "zcard",
        "hlen",
        "hmget",
        "config|resetstat",
    )
    sent = {k: v for k, v in calls.items() if k not in inside}
    # 200 queues x 4 priority keys: a script call per piece of 50 queues, and one before and
    # one after them for the unacked index and hash; nothing per queue, no SCRIPT EXISTS
    # check - all in one round trip
    assert sent == {"evalsha": 4 + 2}
    assert reader.rounds == 1
    assert sum(m.pending for m in got.values()) == 2 * len(queues[::3])

    # the server stops answering mid-read (paused), then dies with the request in flight
    admin.client_pause(3000)
    result: dict[str, object] = {}

    def tick() -> None:
        try:
            result["value"] = reader.read(queues)
        except SourceError as exc:
            result["error"] = exc

    t = threading.Thread(target=tick)
    t.start()
    time.sleep(0.3)
    assert t.is_alive()  # the read is waiting on the server
    private_redis.stop()
    t.join(10)
    assert isinstance(result.get("error"), SourceError)
    assert SECRET not in str(result["error"])


def test_tls_redis_from_a_rediss_url_and_no_secret_on_failure(tls_redis):
    url = tls_redis.url
    r = redis.Redis.from_url(url)
    r.lpush("q", envelope("q"))
    r.lpush("q\x06\x163", envelope("q", stamp=time.time() - 5))
    r.close()
    got = CeleryRedisReader(url).read(["q"])["q"]
    assert got.pending == 2 and got.oldest_pending_age is not None
    # plain TCP against the TLS port, and TLS with a wrong password: redacted failures
    for bad in (
        url.replace("rediss://", "redis://").split("?")[0],
        url.replace(SECRET, SECRET + "x"),
    ):
        m = FallbackReader(CeleryRedisReader(bad, timeout=2), max_age=60).read(["q"])["q"]
        assert m.stale and m.error and SECRET not in m.error


def test_an_unchanged_window_costs_no_store_round_trip(prefix, engine):
    """The first sightings of a window are stored when it changes, not on every tick."""
    calls: list[list[str]] = []

    class Counting(StoredSightings):
        def update_marks(self, source, keys, update):
            calls.append(list(keys))
            super().update_marks(source, keys, update)

    app = producer(prefix)
    for _ in range(3):
        app.send_task("t.x", queue="q")
    app.close()
    clock = Clock()
    reader = CeleryRedisReader(
        f"{REDIS_URL}/0",
        layout=CeleryRedisLayout(global_keyprefix=prefix),
        sightings=Counting(session_factory(engine)),
        clock=clock,
    )
    assert reader.read(["q"])["q"].oldest_pending_age == 0.0
    clock.advance(30)
    assert reader.read(["q"])["q"].oldest_pending_age == 30.0
    assert len(calls) == 1
    redis.Redis.from_url(f"{REDIS_URL}/0").rpop(f"{prefix}q")  # the window changed
    clock.advance(30)
    assert reader.read(["q"])["q"].oldest_pending_age == 60.0
    assert len(calls) == 2
    redis.Redis.from_url(f"{REDIS_URL}/0").delete(f"{prefix}q")  # emptied: forgotten once
    reader.read(["q"])
    reader.read(["q"])
    assert len(calls) == 3

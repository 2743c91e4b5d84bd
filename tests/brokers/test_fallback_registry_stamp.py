"""The fallback rules, building readers from config, the producer stamp, secret scrubbing."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
import redis
from celery import Celery
from celery.signals import before_task_publish
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.brokers import stamp
from autoscaler.brokers.asynq.asynq import AsynqReader
from autoscaler.brokers.base import PUBLISHED_AT_HEADER, MetricsConfigError, Secrets, SourceError
from autoscaler.brokers.embedded.celery_sqla import CelerySqlaReader
from autoscaler.brokers.fallback import FallbackReader, LastKnown
from autoscaler.brokers.lists.redis_list import RedisListReader, RedisStreamReader
from autoscaler.brokers.rabbitmq.celery_rabbitmq import CeleryRabbitMQReader
from autoscaler.brokers.redis.celery_redis import CeleryRedisReader
from autoscaler.brokers.registry import build_reader, build_source, group_queues
from autoscaler.config.metrics_sources import (
    AsynqSource,
    CelerySource,
    RedisListSource,
    RedisStreamSource,
)
from autoscaler.config.models import Queue
from autoscaler.policy.snapshot import QueueMetrics
from tests.brokers.conftest import SECRET
from tests.brokers.helpers import uninstall_stamp
from tests.conftest import REDIS_URL


class ScriptedSource:
    """A stand-in *broker* (not our code): answers or fails as the test scripts it."""

    source_id = "scripted"

    def __init__(self) -> None:
        self.answers: list[object] = []

    def read(self, queues: Sequence[str]) -> dict[str, QueueMetrics]:
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, dict)
        return answer

    def close(self) -> None:
        pass


def m(q: str, pending: int, at: datetime, **kw) -> QueueMetrics:
    return QueueMetrics(q, pending, kw.pop("age", None), kw.pop("in_flight", 0), at, **kw)


def test_fallback_rules_never_raise_never_look_fresh_and_expire():
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    now = [t0]
    src = ScriptedSource()
    fb = FallbackReader(src, max_age=60, clock=lambda: now[0])
    src.answers.append({"a": m("a", 5, t0, in_flight=2), "b": m("b", 1, t0)})
    assert fb.read(["a", "b"])["a"].stale is False
    # an unexpected exception whose text holds a secret: the type only comes through
    now[0] = t0 + timedelta(seconds=20)
    src.answers.append(RuntimeError(f"redis://:{SECRET}@host failed"))
    got = fb.read(["a", "b", "c"])
    assert (got["a"].pending, got["a"].in_flight, got["a"].stale) == (5, 2, True)
    assert got["a"].read_at == t0 and "RuntimeError" in (got["a"].error or "")
    assert SECRET not in repr(got)
    assert (got["c"].pending, got["c"].stale) == (0, True)  # never seen: nothing to act on
    # one queue failing on a good tick: only that one is replaced
    now[0] = t0 + timedelta(seconds=30)
    src.answers.append(
        {"a": m("a", 0, now[0], stale=True, error="WRONGTYPE"), "b": m("b", 3, now[0])}
    )
    got = fb.read(["a", "b"])
    assert (got["a"].pending, got["a"].stale, got["a"].error) == (5, True, "WRONGTYPE")
    assert (got["b"].pending, got["b"].stale) == (3, False)
    # past max_age since the last good reading of a: no numbers, still stale
    now[0] = t0 + timedelta(seconds=61)
    src.answers.append(SourceError("down"))
    got = fb.read(["a", "b"])
    assert (got["a"].pending, got["a"].stale, got["a"].read_at) == (0, True, now[0])
    assert (got["b"].pending, got["b"].stale) == (3, True)  # b's good reading is 31 s old


@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.booleans(), st.integers(0, 9), st.integers(0, 200)),
        max_size=25,
    )
)
def test_fallback_never_returns_a_fresh_reading_the_source_did_not_give(steps):
    """Invariant: fresh output == the source's fresh answer; everything else is stale and
    carries either that queue's last good numbers (within max_age) or zeros."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    now = [t0]
    src = ScriptedSource()
    fb = FallbackReader(src, max_age=100, clock=lambda: now[0])
    last_good: dict[str, QueueMetrics] = {}
    for q, ok, pending, dt in steps:
        now[0] += timedelta(seconds=dt)
        src.answers.append({q: m(q, pending, now[0])} if ok else SourceError("x"))
        got = fb.read([q])[q]
        if ok:
            assert got == m(q, pending, now[0])
            last_good[q] = got
        else:
            assert got.stale
            prev = last_good.get(q)
            if prev is not None and (now[0] - prev.read_at).total_seconds() <= 100:
                assert (got.pending, got.read_at) == (prev.pending, prev.read_at)
            else:
                assert (got.pending, got.in_flight) == (0, 0)


def test_last_known_refuses_a_non_positive_bound():
    with pytest.raises(ValueError):
        LastKnown(0)


def test_registry_builds_the_right_reader_for_each_source(tmp_path):
    env = {
        "WATCH": f"redis://:{SECRET}@127.0.0.1:6379/3",
        "AUTOSCALER_WATCH_BROKER_URL": "amqp://guest:guest@127.0.0.1:5672//",
    }
    cases = [
        (
            CelerySource(url_env="WATCH", global_keyprefix="p:", priority_steps=(0, 5)),
            CeleryRedisReader,
        ),
        (CelerySource(), CeleryRabbitMQReader),
        (CelerySource(url=f"sqla+sqlite:///{tmp_path / 'b.db'}"), CelerySqlaReader),
        (AsynqSource(url="rediss://127.0.0.1:6390/0"), AsynqReader),
        (RedisListSource(url=REDIS_URL), RedisListReader),
        (RedisStreamSource(url=REDIS_URL), RedisStreamReader),
    ]
    for src, cls in cases:
        reader = build_reader(src, env=env)
        assert isinstance(reader, cls)
        assert SECRET not in reader.source_id
        reader.close()
    r = build_reader(cases[0][0], env=env)
    assert isinstance(r, CeleryRedisReader) and r.layout.keys("q") == ["p:q", "p:q\x06\x165"]
    with pytest.raises(MetricsConfigError, match="AUTOSCALER_WATCH_BROKER_URL"):
        build_reader(CelerySource(), env={})
    with pytest.raises(MetricsConfigError) as err:
        build_reader(CelerySource(url=f"kafka://u:{SECRET}@h"), env={})
    assert SECRET not in str(err.value)
    fb = build_source(CelerySource(url=f"redis://:{SECRET}@127.0.0.1:1/0", stale_after=42))
    got = fb.read(["q"])["q"]  # nothing listens on port 1: stale, redacted, no exception
    assert got.stale and SECRET not in (got.error or "")


def test_group_queues_reads_each_source_once():
    a = CelerySource(url="redis://h/0")
    queues = {
        "inference": Queue(metrics=a),
        "train": Queue(metrics=a.model_copy(update={"queue": "training"})),
        "other": Queue(metrics=CelerySource(url="redis://h/1")),
    }
    groups = {g.source.url: g.queues for g in group_queues(queues)}
    assert groups == {
        "redis://h/0": {"inference": ("inference",), "training": ("train",)},
        "redis://h/1": {"other": ("other",)},
    }


def test_stamp_is_installed_once_and_keeps_an_existing_stamp(prefix):
    stamp.install()
    stamp.install()
    try:
        receivers = [r for r in before_task_publish.receivers if "autoscaler" in str(r[0])]
        assert len(receivers) == 1
        headers: dict[str, object] = {PUBLISHED_AT_HEADER: 123.0}
        props: dict[str, object] = {}
        stamp.stamp_publish_time(headers=headers, properties=props)
        assert headers[PUBLISHED_AT_HEADER] == 123.0 and isinstance(props["timestamp"], int)
        app = Celery("p", broker=f"{REDIS_URL}/0", set_as_current=False)
        app.conf.broker_transport_options = {"global_keyprefix": prefix}
        app.send_task("t.x", queue="q")
        app.close()
    finally:
        uninstall_stamp()
    raw = redis.Redis.from_url(REDIS_URL).lindex(f"{prefix}q", -1)
    env = json.loads(raw)
    assert isinstance(env["headers"][PUBLISHED_AT_HEADER], float)
    assert env["properties"]["timestamp"] == int(env["headers"][PUBLISHED_AT_HEADER])


def test_scrub_removes_urls_and_passwords_even_percent_encoded():
    pw = f"{SECRET}/@:%"
    url = f"redis://user:{SECRET}%2F%40%3A%25@h:1/0"
    s = Secrets.from_urls(url)
    text = s.scrub(f"failed {url} with {pw} and {SECRET}%2F%40%3A%25 {uuid.uuid4()}")
    assert SECRET not in text and "h:1" in text


def test_a_stored_reading_comes_back_whole():
    """The last good reading kept in the store returns every field it was saved with (the
    running, scheduled and paused numbers too), and an older row without them still loads."""
    from autoscaler.store.metric_readings import from_json, to_json

    now = datetime(2026, 11, 30, tzinfo=UTC)
    full = QueueMetrics(
        "q",
        4,
        12.5,
        2,
        now,
        external=(("x", 1.5),),
        external_degraded=("y",),
        scheduled=3,
        next_due_at=now.timestamp() + 60,
        scheduled_held=1,
        running=2,
        reserved=1,
        paused=True,
    )
    assert from_json(to_json(full)) == full
    old = {
        "queue": "q",
        "pending": 1,
        "oldest_pending_age": None,
        "in_flight": 0,
        "read_at": now.isoformat(),
        "broker_workers": ["w@h"],  # a field readings had until 2026-12
    }
    assert from_json(old) == QueueMetrics("q", 1, None, 0, now)


_text = st.text(max_size=12)
_num = st.floats(allow_nan=False, allow_infinity=False, width=32)


@given(
    m=st.builds(
        QueueMetrics,
        queue=_text,
        pending=st.integers(0, 10**6),
        oldest_pending_age=st.none() | _num,
        in_flight=st.integers(0, 10**6),
        read_at=st.datetimes(timezones=st.just(UTC)),
        external=st.lists(st.tuples(_text, _num), max_size=3).map(tuple),
        external_degraded=st.lists(_text, max_size=3).map(tuple),
        stale=st.booleans(),
        error=st.none() | _text,
        scheduled=st.integers(0, 10**6),
        next_due_at=st.none() | _num,
        scheduled_held=st.integers(0, 10**6),
        running=st.none() | st.integers(0, 10**4),
        reserved=st.none() | st.integers(0, 10**4),
        paused=st.booleans(),
    )
)
def test_any_reading_survives_the_stores_json(m):
    """Every reading, whatever its tuples hold, comes back equal through the JSON the store
    writes (the shallow `to_json` replaced `asdict`, which deep-copied every field)."""
    from dataclasses import asdict

    from autoscaler.store.metric_readings import from_json, to_json

    data = to_json(m)
    old = asdict(m) | {"read_at": m.read_at.isoformat()}  # what the store wrote before
    assert json.loads(json.dumps(data)) == json.loads(json.dumps(old))
    assert from_json(json.loads(json.dumps(data))) == m

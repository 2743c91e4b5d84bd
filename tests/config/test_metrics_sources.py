"""The `metrics:` block is one model per `source`; documents of the flat model still load.

Every config version stored before the per-source models was `model_dump(mode="json")` of one
flat model holding every source's fields, so each stored `metrics:` block carries the fields of
the other sources at their defaults. Those must keep loading, and keep meaning the same thing.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from autoscaler.brokers.registry import group_queues
from autoscaler.config.errors import ConfigError, refusals_from_validation
from autoscaler.config.loader import parse_config_text
from autoscaler.config.metrics_sources import (
    AsynqSource,
    CelerySource,
    RedisListSource,
    RedisStreamSource,
)
from autoscaler.config.models import Config, Queue

# What the flat model's model_dump(mode="json") wrote, literally, one block per source.
OLD_CELERY = {
    "source": "celery",
    "url": "redis://127.0.0.1:6379/3",
    "url_env": None,
    "queue": "jobs",
    "management_url": None,
    "global_keyprefix": "app:",
    "sep": ":p:",
    "priority_steps": [0, 5],
    "group": None,
    "pop_side": "right",
    "timeout": 2.0,
    "stale_after": 60.0,
    "shared_exchange": "accept",
}
OLD_ASYNQ = {
    "source": "asynq",
    "url": None,
    "url_env": "ASYNQ_URL",
    "queue": None,
    "management_url": None,
    "global_keyprefix": "",
    "sep": "\x06\x16",
    "priority_steps": [0, 3, 6, 9],
    "group": None,
    "pop_side": "right",
    "timeout": 5.0,
    "stale_after": 300.0,
    "shared_exchange": "refuse",
}
OLD_REDIS_LIST = {
    "source": "redis-list",
    "url": "redis://127.0.0.1:6379/4",
    "url_env": None,
    "queue": "work",
    "management_url": None,
    "global_keyprefix": "lists:",
    "sep": "\x06\x16",
    "priority_steps": [0, 3, 6, 9],
    "group": None,
    "pop_side": "left",
    "timeout": 5.0,
    "stale_after": 300.0,
    "shared_exchange": "refuse",
}
OLD_REDIS_STREAM = {
    "source": "redis-stream",
    "url": "redis://127.0.0.1:6379/5",
    "url_env": None,
    "queue": None,
    "management_url": None,
    "global_keyprefix": "streams:",
    "sep": "\x06\x16",
    "priority_steps": [0, 3, 6, 9],
    "group": "workers",
    "pop_side": "right",
    "timeout": 5.0,
    "stale_after": 120.0,
    "shared_exchange": "refuse",
}


def stored(metrics: dict[str, Any]) -> Config:
    return Config.model_validate({"queues": {"q": {"metrics": dict(metrics)}}})


@pytest.mark.parametrize(
    ("old", "means"),
    [
        (
            OLD_CELERY,
            CelerySource(
                url="redis://127.0.0.1:6379/3",
                queue="jobs",
                global_keyprefix="app:",
                sep=":p:",
                priority_steps=(0, 5),
                timeout=2.0,
                stale_after=60.0,
                shared_exchange="accept",
            ),
        ),
        (OLD_ASYNQ, AsynqSource(url_env="ASYNQ_URL")),
        (
            OLD_REDIS_LIST,
            RedisListSource(
                url="redis://127.0.0.1:6379/4",
                queue="work",
                global_keyprefix="lists:",
                pop_side="left",
            ),
        ),
        (
            OLD_REDIS_STREAM,
            RedisStreamSource(
                url="redis://127.0.0.1:6379/5",
                global_keyprefix="streams:",
                group="workers",
                stale_after=120.0,
            ),
        ),
    ],
    ids=["celery", "asynq", "redis-list", "redis-stream"],
)
def test_a_document_of_the_flat_model_loads_and_means_the_same(old, means):
    got = stored(old).queues["q"].metrics
    assert type(got) is type(means) and got == means
    # and what is stored from now on loads back to the same thing
    assert stored(got.model_dump(mode="json")).queues["q"].metrics == means


def test_a_block_without_source_is_celery():
    assert stored({}).queues["q"].metrics == CelerySource()
    assert stored({"url": "amqp://h//"}).queues["q"].metrics == CelerySource(url="amqp://h//")
    assert Queue().metrics == CelerySource()
    no_source = {k: v for k, v in OLD_CELERY.items() if k != "source"}
    assert isinstance(stored(no_source).queues["q"].metrics, CelerySource)


def refused(metrics: dict[str, Any]) -> list[str]:
    with pytest.raises(ValidationError) as err:
        stored(metrics)
    return [str(r) for r in refusals_from_validation(err.value)]


def test_a_field_of_another_source_is_refused_unless_it_holds_the_flat_default():
    (only,) = refused({"pop_side": "left"})
    assert only.startswith("queues.q.metrics.pop_side: unknown field 'pop_side'")
    (only,) = refused({**OLD_ASYNQ, "sep": ":"})
    assert only.startswith("queues.q.metrics.sep: unknown field 'sep'")
    (only,) = refused({**OLD_REDIS_LIST, "group": "g"})
    assert only.startswith("queues.q.metrics.group: unknown field 'group'")
    (only,) = refused({"source": "redis-stream", "priority_steps": [1]})
    assert only.startswith("queues.q.metrics.priority_steps: unknown field")


def test_refusals_keep_their_paths_and_suggestions():
    (only,) = refused({"source": "redis-stream", "gruop": "g"})
    assert only.startswith("queues.q.metrics.gruop: unknown field 'gruop'")
    assert "did you mean 'group'?" in only
    (only,) = refused({"shared_exchang": "accept"})
    assert "queues.q.metrics.shared_exchang" in only and "did you mean 'shared_exchange'?" in only
    (only,) = refused({"url": "redis://h/0", "url_env": "X"})
    assert only.startswith("queues.q.metrics: both 'url' and 'url_env' are set")
    (only,) = refused({"source": "celery", "sep": ""})
    assert only.startswith("queues.q.metrics.sep:")


def test_an_unknown_source_is_refused_like_an_unknown_provider_kind():
    with pytest.raises(ConfigError) as err:
        parse_config_text("queues:\n  q:\n    metrics:\n      source: redis-lst\n")
    (r,) = err.value.refusals
    assert r.path == "queues.q.metrics.source"
    assert r.cause == "unknown metrics source 'redis-lst'"
    assert r.fix == "did you mean 'redis-list'? use one of: celery, asynq, redis-list, redis-stream"
    (only,) = refused({"source": "kafka"})
    assert only.startswith("queues.q.metrics.source: unknown metrics source 'kafka'")
    assert "use one of: celery, asynq, redis-list, redis-stream" in only


def test_sources_still_group_by_value_without_their_queue():
    config = Config.model_validate(
        {
            "queues": {
                "a": {"metrics": {"url": "redis://h/0", "queue": "x"}},
                "b": {"metrics": {"url": "redis://h/0"}},
                "c": {"metrics": {"source": "redis-list", "url": "redis://h/0"}},
            }
        }
    )
    groups = {g.source: g.queues for g in group_queues(config.queues)}
    assert groups == {
        CelerySource(url="redis://h/0"): {"x": ("a",), "b": ("b",)},
        RedisListSource(url="redis://h/0"): {"c": ("c",)},
    }


def test_applying_the_same_config_over_a_flat_era_version_records_nothing(sessions):
    """A version stored by the flat model (every source's fields in its metrics block) and the
    same config applied today mean the same: no new version. A real change still records one."""
    from datetime import UTC, datetime

    from autoscaler.config import load_config_text
    from autoscaler.control.apply import record
    from autoscaler.store import config_versions
    from autoscaler.store.db import transaction

    text = """
providers: {gpu: {kind: mock}}
queues:
  q:
    metrics: {source: asynq, url: "redis://127.0.0.1:6379/0"}
    autoscale: {provider: gpu, max_workers: 1, instance: {gpu: x, max_price_per_hour: 1.0}}
"""
    config = load_config_text(text)
    flat = config.model_dump(mode="json")
    flat["queues"]["q"]["metrics"] = dict(OLD_ASYNQ, url="redis://127.0.0.1:6379/0", url_env=None)
    now = datetime.now(UTC)
    with transaction(sessions) as s:
        assert config_versions.record(s, flat, "older release", now) is not None
        assert record(s, config, "today", now, None) is None
        changed = load_config_text(text.replace("max_workers: 1", "max_workers: 2"))
        assert record(s, changed, "today", now, "more") is not None

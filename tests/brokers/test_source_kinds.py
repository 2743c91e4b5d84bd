"""A metrics source kind is its config model (a member of `config.metrics_sources.MetricsSource`,
tagged with its `source`), its module's `build`, and its one line in `brokers.registry.READERS`:
every kind of the union has exactly one entry and every entry is a kind of the union, or this
fails. Celery's readers likewise, one per broker its URL may name (`CELERY_TRANSPORTS`)."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from autoscaler.brokers.base import MetricsReader
from autoscaler.brokers.registry import CELERY_TRANSPORTS, READERS, build_reader
from autoscaler.config.metrics_sources import METRICS_SOURCES, SOURCE_MODELS, MetricsSource
from autoscaler.urls import Transport


def _union() -> list[tuple[type[Any], str]]:
    """Each member of the config's source union: its model and its discriminator tag."""
    union, _discriminator = get_args(MetricsSource)
    members = []
    for member in get_args(union):
        model, tag = get_args(member)
        members.append((model, tag.tag))
    return members


def _kind(model: type[Any]) -> str:
    (kind,) = get_args(model.model_fields["source"].annotation)
    return str(kind)


KINDS = [_kind(model) for model, _tag in _union()]

MINIMAL: dict[str, dict[str, Any]] = {
    "celery": {"url": "redis://127.0.0.1:1/0"},
    "asynq": {"url": "redis://127.0.0.1:1/0"},
    "redis-list": {"url": "redis://127.0.0.1:1/0"},
    "redis-stream": {"url": "redis://127.0.0.1:1/0", "group": "g"},
}
"""A block of each kind that builds (nothing listens on port 1: building connects nowhere)."""

CELERY_URLS: dict[str, str] = {
    "redis": "redis://127.0.0.1:1/0",
    "amqp": "amqp://guest:guest@127.0.0.1:1//",
    "sqla": "sqla+sqlite:///{tmp}/broker.db",
}


def test_every_source_kind_of_the_config_has_exactly_one_reader_entry():
    assert len(KINDS) == len(set(KINDS)), KINDS
    assert sorted(KINDS) == sorted(READERS), "a kind without an entry, or an entry without a kind"
    for model, tag in _union():  # the union's tag is the model's `source`
        assert tag == _kind(model), model
    # the kinds `config.errors` names in refusals are the union's
    assert {model for model, _tag in _union()} == set(SOURCE_MODELS)
    assert sorted(METRICS_SOURCES) == sorted(KINDS)
    assert set(MINIMAL) == set(KINDS), "a new kind: add its minimal block here"


def test_every_celery_transport_has_exactly_one_reader_entry():
    readable = set(get_args(Transport)) - {"other"}  # `other`: refused, with the schemes we read
    assert set(CELERY_TRANSPORTS) == readable
    assert set(CELERY_URLS) == readable, "a new transport: add a URL of it here"


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_builds_its_reader_through_the_registry(kind):
    (model,) = [m for m, _tag in _union() if _kind(m) == kind]
    reader = build_reader(model.model_validate(MINIMAL[kind]), env={})
    try:
        assert isinstance(reader, MetricsReader)
        assert reader.source_id.startswith(kind)
    finally:
        reader.close()


@pytest.mark.parametrize("name", sorted(CELERY_URLS))
def test_each_celery_transport_builds_its_reader(name, tmp_path):
    (model,) = [m for m, _tag in _union() if _kind(m) == "celery"]
    url = CELERY_URLS[name].format(tmp=tmp_path)
    reader = build_reader(model.model_validate({"url": url}), env={})
    try:
        assert isinstance(reader, MetricsReader)
        assert type(reader).__module__.startswith("autoscaler.brokers.")
    finally:
        reader.close()

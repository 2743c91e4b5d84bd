"""The loop's view of the stored config: the newest version that still validates."""

from __future__ import annotations

import logging

from autoscaler.config import load_config_text
from autoscaler.config.triggers import MetricTrigger
from autoscaler.control.runtime import Runtime, utc_now
from autoscaler.settings import Settings
from autoscaler.store import config_versions, migrate
from tests.control.outbox import RecordingOutbox

GOOD = """
providers:
  sandbox: {kind: mock}
queues:
  jobs:
    metrics: {source: celery, url: "redis://127.0.0.1:6379/9"}
    autoscale:
      provider: sandbox
      max_workers: 2
      scale_up: [{trigger: no_workers}]
      instance: {gpu: "RTX 4090", max_price_per_hour: 0.5}
"""


def _runtime(tmp_path, db_url: str) -> Runtime:
    migrate.upgrade(db_url)
    settings = Settings.from_env(
        {"AUTOSCALER_HOME": str(tmp_path), "AUTOSCALER_DATABASE_URL": db_url}
    )
    return Runtime(settings, env={})


def test_a_stored_version_that_no_longer_validates_is_not_run_the_last_good_one_is(
    tmp_path, db_url, caplog
):
    rt = _runtime(tmp_path, db_url)
    try:
        good = load_config_text(GOOD).model_dump(mode="json")
        broken = {**good, "poll_interval": 0.001}  # stored by an older release, refused now
        with rt.transaction() as session:
            config_versions.record(session, good, "alice", utc_now())
            config_versions.record(session, broken, "bob", utc_now())
        with caplog.at_level(logging.ERROR, logger="autoscaler.control"), rt.transaction() as s:
            loaded = rt.load(s)
        assert loaded is not None and loaded.version == 1
        assert "config version 2 no longer validates" in caplog.text
        # a fixed version is picked up at once
        with rt.transaction() as session:
            config_versions.record(session, {**good, "poll_interval": 5.0}, "bob", utc_now())
            loaded = rt.load(session)
        assert loaded is not None and loaded.version == 3 and loaded.config.poll_interval == 5.0
    finally:
        rt.close()


def test_when_no_stored_version_validates_the_loop_runs_nothing(tmp_path, db_url):
    rt = _runtime(tmp_path, db_url)
    try:
        with rt.transaction() as session:
            config_versions.record(session, {"queues": {"bad name": {}}}, "x", utc_now())
            assert rt.load(session) is None
    finally:
        rt.close()


def test_prometheus_readers_are_kept_per_config_version_and_dropped_with_it(tmp_path, db_url):
    rt = _runtime(tmp_path, db_url)
    try:
        doc = load_config_text(GOOD).model_dump(mode="json")
        metric = {"trigger": "metric", "query": "up", "url": "http://127.0.0.1:1", "threshold": 1}
        doc["queues"]["jobs"]["autoscale"]["scale_up"].append(metric)
        with rt.transaction() as session:
            config_versions.record(session, doc, "alice", utc_now())
            loaded = rt.load(session)
        assert loaded is not None
        auto = loaded.config.queues["jobs"].autoscale
        assert auto is not None
        trig = auto.scale_up[-1]
        assert isinstance(trig, MetricTrigger)
        first = rt.prometheus(trig)
        assert rt.prometheus(trig) is first  # one reader per address while the version runs
        with rt.transaction() as session:
            config_versions.record(session, {**doc, "poll_interval": 5.0}, "bob", utc_now())
            assert rt.load(session) is not None
        assert rt.prometheus(trig) is not first  # a new version: built anew
    finally:
        rt.close()


def test_the_collector_is_off_inside_an_evaluation_and_back_after_it_whatever_happens():
    """`collector_paused` turns Python's cycle collector off for a tick and always on again,
    after an error too; inside a pause, or with the collector off already, it leaves it alone."""
    import gc

    import pytest

    from autoscaler.control.runtime import collector_paused

    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("the tick failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_an_evaluation_runs_with_the_collector_off(tmp_path, monkeypatch):
    """The tick itself is what runs paused (the 10,000-queue tick spent a third of its time in
    the collector): seen from inside `build_snapshot`."""
    import gc

    import autoscaler.control.tick.evaluate as tick
    from autoscaler.control.tick.evaluate import evaluate
    from autoscaler.control.tick.snapshot import build_snapshot

    rt = _runtime(tmp_path, f"sqlite:///{tmp_path / 'state.db'}")
    seen: list[bool] = []
    real = build_snapshot

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(tick, "build_snapshot", spy)
    try:
        with rt.transaction() as session:
            config_versions.record(
                session, load_config_text(GOOD).model_dump(mode="json"), "alice", utc_now()
            )
        evaluate(rt, RecordingOutbox(), trigger="manual")
    finally:
        rt.close()
    assert seen == [False] and gc.isenabled()

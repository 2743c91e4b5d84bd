"""Beat's schedule from the stored config: entries, cron firings, copies, and rebuilds."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from celery import Celery

from autoscaler.config import load_config_text
from autoscaler.control import beat
from autoscaler.control.beat import (
    DEFAULT_INTERVAL,
    FAST_PATH_EVERY,
    ConfigScheduler,
    CronSchedule,
    entries,
)
from autoscaler.control.runtime import Loaded, Runtime
from autoscaler.settings import Settings
from autoscaler.store import config_versions, migrate
from autoscaler.store.db import transaction

BASE = {"autoscaler-tick", "autoscaler-fast-path", "autoscaler-reconcile", "autoscaler-retention"}


def queue(**auto: Any) -> dict[str, Any]:
    block: dict[str, Any] = {
        "provider": "gpu",
        "max_workers": 4,
        "instance": {"gpu": "RTX 4090", "max_price_per_hour": 0.6},
    }
    block.update(auto)
    return {"autoscale": block}


def document(queues: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"providers": {"gpu": {"kind": "mock"}}, **top, "queues": queues}


def loaded(queues: dict[str, Any], version: int = 3, **top: Any) -> Loaded:
    text = yaml.safe_dump(document(queues, **top))
    return Loaded(version, load_config_text(text))


PARIS_PREWARM = {
    "trigger": "schedule",
    "cron": "0 9 * * 1-5",
    "timezone": "Europe/Paris",
    "workers": 2,
    "duration": 3600,
}
NIGHT = {"trigger": "schedule", "cron": "0 20 * * *"}
NY_QUARTER = {
    "trigger": "schedule",
    "cron": "*/15 * * * *",
    "timezone": "America/New_York",
    "workers": 1,
    "duration": 600,
}
QUEUES = {
    "a": queue(
        poll_interval=10,
        scale_up=[{"trigger": "queue_depth", "threshold": 1}, PARIS_PREWARM],
        scale_down=[{"trigger": "idle", "timeout": 60}, NIGHT],
    ),
    "b": queue(poll_interval="20s", scale_up=[NY_QUARTER]),
    "c": queue(),  # the global poll interval
    "off": queue(enabled=False, poll_interval=5, scale_up=[PARIS_PREWARM]),
    "watched": {},  # no autoscale block
}


# --------------------------------------------------------------------------- entries


def test_without_a_config_the_loop_runs_on_the_defaults():
    got = entries(None)
    assert set(got) == BASE
    assert got["autoscaler-tick"]["task"] == "autoscaler.tick"
    assert got["autoscaler-tick"]["schedule"] == timedelta(seconds=DEFAULT_INTERVAL)
    assert got["autoscaler-fast-path"]["task"] == "autoscaler.fast_path"
    assert got["autoscaler-fast-path"]["schedule"] == timedelta(seconds=FAST_PATH_EVERY)
    assert got["autoscaler-reconcile"]["task"] == "autoscaler.reconcile"
    assert got["autoscaler-reconcile"]["schedule"] == timedelta(seconds=DEFAULT_INTERVAL)
    for entry in got.values():  # a tick that waited in the queue too long is dropped
        assert entry["options"]["expires"] > 0
    assert got["autoscaler-fast-path"]["options"]["expires"] == 2 * FAST_PATH_EVERY


def test_one_entry_per_schedule_trigger_of_each_autoscaled_queue():
    got = entries(loaded(QUEUES))
    crons = {k: v for k, v in got.items() if k not in BASE}
    assert set(crons) == {"schedule:a:up1", "schedule:a:down1", "schedule:b:up0"}
    expected = {
        "schedule:a:up1": ("0 9 * * 1-5", "Europe/Paris", "a"),
        "schedule:a:down1": ("0 20 * * *", "UTC", "a"),
        "schedule:b:up0": ("*/15 * * * *", "America/New_York", "b"),
    }
    for key, (cron, zone, name) in expected.items():
        entry = crons[key]
        assert entry["task"] == "autoscaler.tick"
        assert entry["schedule"] == CronSchedule(cron, zone)
        assert entry["kwargs"] == {"trigger": f"schedule {cron} ({zone})", "queue": name}
        assert entry["options"]["expires"] == 120.0


def test_the_tick_runs_at_the_smallest_poll_interval_of_the_autoscaled_queues():
    got = entries(loaded(QUEUES, poll_interval=45))
    assert got["autoscaler-tick"]["schedule"] == timedelta(seconds=10)  # a's, not off's 5 s
    assert got["autoscaler-tick"]["options"]["expires"] == 10
    # reconcile follows the global poll interval
    assert got["autoscaler-reconcile"]["schedule"] == timedelta(seconds=45)
    assert got["autoscaler-reconcile"]["options"]["expires"] == 45
    assert got["autoscaler-fast-path"]["schedule"] == timedelta(seconds=FAST_PATH_EVERY)


@pytest.mark.parametrize(
    ("queues", "tick"),
    [
        ({"c": queue()}, 45),  # only the global interval
        ({"c": queue(), "d": queue(poll_interval=90)}, 45),  # a longer one does not win
        ({"d": queue(poll_interval=90)}, 90),
        ({"off": queue(enabled=False, poll_interval=5)}, 45),  # nothing autoscaled
        ({"w": {}}, 45),
    ],
)
def test_tick_interval_cases(queues, tick):
    got = entries(loaded(queues, poll_interval=45))
    assert got["autoscaler-tick"]["schedule"] == timedelta(seconds=tick)
    assert set(got) == BASE


# --------------------------------------------------------------------------- cron firings


class _Clock:
    """Beat's clock, frozen and moved by the test."""

    now = datetime(2025, 6, 2, 12, 0, 30, tzinfo=UTC)


@pytest.fixture
def clock(monkeypatch) -> type[_Clock]:
    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):  # type: ignore[override]
            assert tz is UTC
            return _Clock.now

    monkeypatch.setattr(beat, "datetime", Frozen)
    return _Clock


def test_a_cron_is_due_once_its_latest_firing_is_after_the_last_run(clock):
    every_minute = CronSchedule("* * * * *", "UTC")
    clock.now = datetime(2025, 6, 2, 12, 0, 30, tzinfo=UTC)
    fired = datetime(2025, 6, 2, 12, 0, tzinfo=UTC)
    state = every_minute.is_due(fired - timedelta(seconds=1))
    assert state.is_due is True
    assert state.next == pytest.approx(30.05)  # checked again at the next minute
    assert every_minute.is_due(fired).is_due is False  # ran at the firing itself
    assert every_minute.is_due(fired + timedelta(seconds=1)).is_due is False
    # beat may hand over a naive UTC time
    naive = (fired - timedelta(seconds=1)).replace(tzinfo=None)
    assert every_minute.is_due(naive).is_due is True
    assert every_minute.is_due(fired.replace(tzinfo=None)).is_due is False
    assert every_minute.remaining_estimate(fired) == timedelta(seconds=30.05)


def test_a_cron_fires_exactly_once_per_firing_as_beat_polls_it(clock):
    """Beat polls every second and records each run: every minute's firing runs once, at its
    first poll."""
    every_minute = CronSchedule("* * * * *", "UTC")
    start = datetime(2025, 6, 2, 11, 59, 59, tzinfo=UTC)
    last_run = datetime(2025, 6, 2, 11, 59, 0, 500_000, tzinfo=UTC)
    runs = []
    for s in range(0, 3 * 60 + 1):
        clock.now = start + timedelta(seconds=s)
        if every_minute.is_due(last_run).is_due:
            runs.append(clock.now)
            last_run = clock.now
    assert runs == [datetime(2025, 6, 2, 12, m, tzinfo=UTC) for m in range(3)]


def test_a_cron_in_a_time_zone_fires_on_its_local_minute(clock):
    prewarm = CronSchedule("0 9 * * 1-5", "Europe/Paris")  # 07:00 UTC in summer
    yesterday = datetime(2025, 6, 1, 23, 0, tzinfo=UTC)
    clock.now = datetime(2025, 6, 2, 6, 59, 59, tzinfo=UTC)
    assert prewarm.is_due(yesterday).is_due is False
    clock.now = datetime(2025, 6, 2, 7, 0, 0, tzinfo=UTC)
    assert prewarm.is_due(yesterday).is_due is True
    assert prewarm.is_due(clock.now).is_due is False
    clock.now = datetime(2025, 6, 2, 8, 0, 0, tzinfo=UTC)  # 09:00 UTC is not 09:00 Paris
    assert prewarm.is_due(datetime(2025, 6, 2, 7, 0, 1, tzinfo=UTC)).is_due is False


# --------------------------------------------------------------------------- copies


def test_cron_schedules_compare_hash_and_pickle_by_expression_and_zone():
    a = CronSchedule("0 9 * * 1-5", "Europe/Paris")
    same = CronSchedule("0 9 * * 1-5", "Europe/Paris")
    assert a == same and hash(a) == hash(same)
    assert len({a, same}) == 1
    assert a != CronSchedule("0 9 * * 1-5", "UTC")
    assert a != CronSchedule("0 10 * * 1-5", "Europe/Paris")
    assert a != "0 9 * * 1-5"
    for twin in (pickle.loads(pickle.dumps(a)), copy.copy(a), copy.deepcopy(a)):
        assert isinstance(twin, CronSchedule)
        assert twin == a and hash(twin) == hash(a)
        assert (twin.expr, twin.tz_name) == ("0 9 * * 1-5", "Europe/Paris")
    assert "0 9 * * 1-5" in repr(a) and "Europe/Paris" in repr(a)


# --------------------------------------------------------------------------- the scheduler


@pytest.fixture
def store(tmp_path, sqlite_url, monkeypatch) -> Iterator[Runtime]:
    migrate.upgrade(sqlite_url)
    settings = Settings.from_env(
        {"AUTOSCALER_HOME": str(tmp_path / "home"), "AUTOSCALER_DATABASE_URL": sqlite_url}
    )
    rt = Runtime(settings, env={})
    monkeypatch.setattr(beat, "runtime", lambda: rt)
    try:
        yield rt
    finally:
        rt.close()


def apply(rt: Runtime, doc: dict[str, Any], at: datetime) -> None:
    with transaction(rt.sessions) as s:
        assert config_versions.record(s, doc, "test", at) is not None


def test_the_scheduler_is_rebuilt_when_a_new_config_version_is_applied(store, monkeypatch):
    app = Celery("beat-test", broker="memory://", set_as_current=False)
    sched = ConfigScheduler(app=app)
    assert set(sched.schedule) >= BASE
    assert not any(k.startswith("schedule:") for k in sched.schedule)
    defaults = {k for k in sched.schedule if k.startswith("celery.")}

    t0 = datetime(2025, 6, 2, 12, 0, tzinfo=UTC)
    apply(store, document({"a": QUEUES["a"]}, poll_interval=30), t0)
    sched._rebuild()
    assert set(sched.schedule) == BASE | {"schedule:a:up1", "schedule:a:down1"} | defaults
    entry = sched.schedule["schedule:a:up1"]
    assert entry.schedule == CronSchedule("0 9 * * 1-5", "Europe/Paris")
    assert entry.kwargs == {"trigger": "schedule 0 9 * * 1-5 (Europe/Paris)", "queue": "a"}
    assert entry.options["expires"] == 120.0
    assert sched.schedule["autoscaler-tick"].schedule.run_every == timedelta(seconds=10)

    # the same version again: nothing rebuilt
    built: list[object] = []
    monkeypatch.setattr(beat, "entries", lambda ld: built.append(ld) or entries(ld))
    sched._rebuild()
    assert built == []

    # a new version: the removed trigger goes, the new interval is used
    apply(store, document({"b": QUEUES["b"]}, poll_interval=30), t0 + timedelta(minutes=1))
    sched._rebuild()
    assert [ld.version for ld in built] == [2]
    assert set(sched.schedule) == BASE | {"schedule:b:up0"} | defaults
    assert sched.schedule["autoscaler-tick"].schedule.run_every == timedelta(seconds=20)

    # the store down: the schedule is kept as it is
    def down() -> None:
        raise OSError("store down")

    monkeypatch.setattr(store, "transaction", down)
    sched._rebuild()
    assert set(sched.schedule) == BASE | {"schedule:b:up0"} | defaults

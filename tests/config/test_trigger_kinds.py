"""Every trigger kind of the config's unions describes itself (`describe()`, the dry run's
line): a kind added to `ScaleUpTrigger` or `ScaleDownTrigger` without its own description
fails here, rather than `validate` crashing or a summary's `isinstance` chain skipping it."""

from __future__ import annotations

import typing
from datetime import UTC, datetime

import pytest

from autoscaler.config.machine_specs import WarmPool
from autoscaler.config.triggers import IdleTrigger, ScaleDownTrigger, ScaleUpTrigger, _Trigger

NOW = datetime(2025, 6, 3, 10, 0, tzinfo=UTC)

EXAMPLES: dict[str, list[dict[str, object]]] = {
    "NoWorkersTrigger": [{"trigger": "no_workers"}],
    "QueueDepthTrigger": [
        {"trigger": "queue_depth", "threshold": 50},
        {"trigger": "queue_depth", "target_per_worker": 20},
    ],
    "LatencyTrigger": [{"trigger": "latency", "max_latency": "5m"}],
    "MetricTrigger": [
        {"trigger": "metric", "query": "up", "url": "http://prom:9090", "threshold": 3},
        {"trigger": "metric", "query": "up", "url_env": "PROM_URL", "target_per_worker": 8},
    ],
    "ScheduleUpTrigger": [
        {"trigger": "schedule", "cron": "30 7 * * 1-5", "workers": 2, "duration": "2h"}
    ],
    "IdleTrigger": [
        {"trigger": "idle", "timeout": "10m"},
        {"trigger": "idle", "timeout": 120, "learn": False},
    ],
    "ScheduleDownTrigger": [{"trigger": "schedule", "cron": "0 22 * * *", "timezone": "UTC"}],
}
"""Valid options of every kind (each of its modes): a new kind needs its examples here."""


def _kinds(union: object) -> tuple[type, ...]:
    (members, *_) = typing.get_args(union)
    return typing.get_args(members)


KINDS = sorted({*_kinds(ScaleUpTrigger), *_kinds(ScaleDownTrigger)}, key=lambda k: k.__name__)


def test_the_examples_cover_every_trigger_kind():
    assert {k.__name__ for k in KINDS} == set(EXAMPLES), "a new kind: add its examples here"


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_every_trigger_kind_describes_itself(kind):
    assert issubclass(kind, _Trigger), kind
    assert "describe" in vars(kind), f"{kind.__name__} does not describe itself"
    for options in EXAMPLES[kind.__name__]:
        trig = kind.model_validate(options)
        for pool in (None, WarmPool(), WarmPool(size=2)):
            line = trig.describe(NOW, pool)
            assert isinstance(line, str) and line and "\n" not in line, (options, line)


def test_a_kind_without_its_own_description_is_refused_loudly():
    class Unexplained(_Trigger):
        trigger: typing.Literal["unexplained"]

    with pytest.raises(NotImplementedError, match="Unexplained does not describe itself"):
        Unexplained(trigger="unexplained").describe(NOW)


def test_the_descriptions_say_what_each_mode_does():
    def line(options: dict[str, object], pool: WarmPool | None = None) -> str:
        (kind,) = [k for k in KINDS if options in EXAMPLES[k.__name__]]
        return kind.model_validate(options).describe(NOW, pool)

    depth, per_worker = EXAMPLES["QueueDepthTrigger"]
    assert line(depth) == "more than 50 jobs pending → add 1 machine"
    assert line(per_worker) == "queue depth → ceil(pending / 20) machines"
    above, target = EXAMPLES["MetricTrigger"]
    assert line(above) == "Prometheus 'up' above 3 → add 1 machine"
    assert line(target) == "Prometheus 'up' → ceil(value / 8) machines"
    (up,) = EXAMPLES["ScheduleUpTrigger"]
    assert line(up).endswith("next 2025-06-04 07:30 UTC")
    (down,) = EXAMPLES["ScheduleDownTrigger"]
    assert line(down).endswith("next 2025-06-03 22:00 UTC")
    idle = IdleTrigger(trigger="idle", timeout=300)
    assert "stop its machine while the warm pool has room" in idle.describe(NOW, WarmPool(size=1))
    assert "destroy its machine (most idle" in idle.describe(NOW, WarmPool(size=0))
    assert "destroy its machine (most idle" in idle.describe(NOW)
    assert "up to 20m" in idle.describe(NOW)
    assert "quiet gaps" not in IdleTrigger(trigger="idle", timeout=300, learn=False).describe(NOW)

"""The seed's block loads unchanged, and every trigger of the product loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscaler.config import Config, ConfigError, load_config
from autoscaler.config.provider_options import PROVIDER_KINDS, VastOptions
from autoscaler.config.triggers import (
    IdleTrigger,
    LatencyTrigger,
    MetricTrigger,
    NoWorkersTrigger,
    QueueDepthTrigger,
    ScheduleDownTrigger,
    ScheduleUpTrigger,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
VAST = {"gpu-vast": VastOptions(kind="vast")}


def test_seed_block_loads_unchanged_with_its_provider_registered():
    config = load_config(EXAMPLES / "seed.yaml", VAST)
    auto = config.queues["inference"].autoscale
    assert auto is not None
    assert auto.provider == "gpu-vast"
    assert (auto.min_workers, auto.max_workers) == (0, 4)
    assert auto.scale_up == (
        NoWorkersTrigger(trigger="no_workers"),
        QueueDepthTrigger(trigger="queue_depth", threshold=50),
        LatencyTrigger(trigger="latency", max_latency=300.0),
    )
    assert auto.scale_down == (IdleTrigger(trigger="idle", timeout=600.0),)
    assert auto.instance.gpu == "RTX 4090"
    assert auto.instance.disk_gb == 50
    assert auto.instance.max_price_per_hour == pytest.approx(0.60)
    deployment = config.queues["inference"].deployment
    assert deployment is not None and deployment.startup_cmd == "python main.py"


def test_seed_block_without_its_provider_is_refused_naming_it():
    with pytest.raises(ConfigError) as exc:
        load_config(EXAMPLES / "seed.yaml")
    assert "unknown provider 'gpu-vast'" in str(exc.value)


def test_full_example_loads_every_trigger_and_provider_kind():
    config = load_config(EXAMPLES / "full.yaml")
    kinds = {name: p.kind for name, p in config.providers.items()}
    assert set(kinds.values()) == set(PROVIDER_KINDS)
    triggers = [t for q in config.queues.values() if q.autoscale for t in q.autoscale.scale_up]
    downs = [t for q in config.queues.values() if q.autoscale for t in q.autoscale.scale_down]
    for cls in (
        NoWorkersTrigger,
        QueueDepthTrigger,
        LatencyTrigger,
        MetricTrigger,
        ScheduleUpTrigger,
    ):
        assert any(isinstance(t, cls) for t in triggers), cls
    for cls in (IdleTrigger, ScheduleDownTrigger):
        assert any(isinstance(t, cls) for t in downs), cls
    sched = next(t for t in triggers if isinstance(t, ScheduleUpTrigger))
    assert sched.timezone == "Europe/Paris" and sched.workers == 2 and sched.duration == 7200.0
    assert config.limits.max_machines == 6
    assert config.backoff.cap == 600.0


def test_defaults_are_sane():
    config = Config.model_validate({})
    assert config.poll_interval == 30.0
    assert config.backoff.cap == 600.0  # the seed's "up to 10 minutes"
    assert config.boot_timeout > 0 and config.heartbeat_timeout == 300.0

"""`Config.queue_settings(name)`: a queue's effective settings, its own where it sets one in
`autoscale:`, else the config-wide ones, made once when the config is (validated or copied),
instead of `auto.x or config.x` written by hand at every use."""

from __future__ import annotations

import dataclasses

import pytest

from autoscaler.config.models import Autoscale, Config, QueueSettings

INSTANCE = {"gpu": "RTX 4090", "max_price_per_hour": 1.0}


def _config(**queues: dict[str, object]) -> Config:
    return Config.model_validate(
        {
            "poll_interval": 20,
            "boot_timeout": 600,
            "queues": {
                name: {"autoscale": {"provider": "p", "max_workers": 2, "instance": INSTANCE, **a}}
                for name, a in queues.items()
            }
            | {"plain": {}},
        }
    )


def test_every_setting_a_queue_may_set_for_itself_is_in_the_record():
    """A field of both `autoscale:` and the top level is a per-queue override of a config-wide
    value: it belongs in QueueSettings, or its resolution would be written by hand again."""
    shared = set(Autoscale.model_fields) & set(Config.model_fields)
    assert {f.name for f in dataclasses.fields(QueueSettings)} == shared


def test_a_queue_has_its_own_values_else_the_config_wide_ones():
    config = _config(
        own={"poll_interval": 5, "boot_timeout": 120},
        half={"boot_timeout": 300},
        none={},
        off={"enabled": False, "poll_interval": 7},
    )
    assert config.queue_settings("own") == QueueSettings(poll_interval=5, boot_timeout=120)
    assert config.queue_settings("half") == QueueSettings(poll_interval=20, boot_timeout=300)
    assert config.queue_settings("none") == QueueSettings(poll_interval=20, boot_timeout=600)
    # a disabled queue keeps its own settings (reconcile still watches its machines)
    assert config.queue_settings("off") == QueueSettings(poll_interval=7, boot_timeout=600)
    # no autoscale block, or a queue no longer configured: the config-wide ones
    wide = QueueSettings(poll_interval=20, boot_timeout=600)
    assert config.queue_settings("plain") == wide
    assert config.queue_settings("gone") == wide


def test_made_once_per_config_and_frozen():
    config = _config(own={"poll_interval": 5})
    assert config.queue_settings("own") is config.queue_settings("own")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.queue_settings("own").poll_interval = 1  # type: ignore[misc]


def test_a_copy_follows_its_own_fields():
    """`model_copy(update=…)` skips validators: the copy's settings are made again."""
    config = _config(own={"poll_interval": 5}, none={})
    wider = config.model_copy(update={"poll_interval": 40, "boot_timeout": 900})
    assert wider.queue_settings("none") == QueueSettings(poll_interval=40, boot_timeout=900)
    assert wider.queue_settings("own") == QueueSettings(poll_interval=5, boot_timeout=900)
    assert config.queue_settings("none") == QueueSettings(poll_interval=20, boot_timeout=600)
    q = config.queues["none"]
    assert q.autoscale is not None
    auto = q.autoscale.model_copy(update={"boot_timeout": 60.0})
    retuned = config.model_copy(
        update={"queues": {**config.queues, "none": q.model_copy(update={"autoscale": auto})}}
    )
    assert retuned.queue_settings("none") == QueueSettings(poll_interval=20, boot_timeout=60)
    assert retuned.model_copy(deep=True).queue_settings("none").boot_timeout == 60


def test_equal_configs_stay_equal_and_round_trip():
    config = _config(own={"poll_interval": 5})
    again = Config.model_validate(config.model_dump())
    assert again == config
    assert again.queue_settings("own") == config.queue_settings("own")

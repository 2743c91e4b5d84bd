"""A config the loop may run: every check `autoscaler validate` makes, then a new version.

`autoscaler apply`, the admin API's `PUT /v1/admin/config` and the dashboard's edits and
rollbacks all come through here, so that a config one of them refuses the others refuse too.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from autoscaler.config.errors import ConfigError
from autoscaler.config.isolation import check_broker_isolation
from autoscaler.config.models import Config
from autoscaler.settings import Settings
from autoscaler.store import config_versions
from autoscaler.store.config_versions import ConfigRecord
from autoscaler.store.db import Session


def runnable(config: Config, source: str, settings: Settings, env: Mapping[str, str]) -> Config:
    """`config` (loaded with `runnable=True`) if the control plane may run it: ConfigError when a
    watched queue lives on the control plane's own Redis database and prefix, or a URL cannot
    be read."""
    refusals = check_broker_isolation(config, settings.broker_url, settings.control_keyprefix, env)
    if refusals:
        raise ConfigError(refusals, source)
    return config


def record(
    session: Session, config: Config, changed_by: str, now: datetime, comment: str | None
) -> ConfigRecord | None:
    """The checked config as a new version (who, when, why); None when nothing changed.

    "Changed" is judged on what the documents mean: the newest one is read through today's
    models first, so a document stored by an older release (the flat metrics block held every
    source's fields) equals the same config written today."""
    document = config.model_dump(mode="json")
    latest = config_versions.latest(session)
    if latest is not None and _meaning(latest.document) == document:
        return None
    return config_versions.record(session, document, changed_by, now, comment)


def _meaning(document: dict[str, Any]) -> dict[str, Any] | None:
    """A stored document as today's models dump it; None when it no longer validates."""
    try:
        return Config.model_validate(document).model_dump(mode="json")
    except ValidationError:
        return None


__all__ = ["record", "runnable"]

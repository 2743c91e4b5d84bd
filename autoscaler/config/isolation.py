"""The control plane's broker must never be a watched application's Redis database and prefix.

If it were, our Celery workers would see the watched app's `unacked` hash as their own and
requeue its in-flight messages under *our* visibility timeout: jobs run twice, or are lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from autoscaler.config.errors import Refusal
from autoscaler.config.models import Config

WATCH_BROKER_ENV = "AUTOSCALER_WATCH_BROKER_URL"
"""Where a queue's metrics are read when its config names no URL."""

_REDIS = ("redis", "rediss")


def _redis_target(url: str) -> tuple[str, int, int] | None:
    parts = urlsplit(url)
    if parts.scheme not in _REDIS:
        return None
    db = parts.path.strip("/") or "0"
    return (parts.hostname or "localhost", parts.port or 6379, int(db) if db.isdigit() else 0)


def check_broker_isolation(
    config: Config, control_broker_url: str, control_prefix: str, env: Mapping[str, str]
) -> list[Refusal]:
    """Refusals for watched queues on our broker's Redis database and prefix.

    A queue's URL is its `url`, else the variable named by `url_env`, else the watched-broker
    default (WATCH_BROKER_ENV) — the same resolution the metrics sources use.
    """
    ours = _redis_target(control_broker_url)
    if ours is None:
        return []
    refusals = []
    for name, queue in config.queues.items():
        url = queue.metrics.url or env.get(queue.metrics.url_env or WATCH_BROKER_ENV)
        if url is None or _redis_target(url) != ours:
            continue
        if queue.metrics.global_keyprefix == control_prefix:
            refusals.append(
                Refusal(
                    f"queues.{name}.metrics.url",
                    "the watched queue lives on the control plane's own Redis database and key "
                    "prefix, so our workers would requeue its unacked jobs",
                    "give AUTOSCALER_BROKER_URL another Redis database number (e.g. /15) or "
                    "another server",
                )
            )
    return refusals

"""The control plane's broker must never be a watched application's Redis database and prefix.

If it were, our Celery workers would see the watched app's `unacked` hash as their own and
requeue its in-flight messages under *our* visibility timeout: jobs run twice, or are lost.
"""

from __future__ import annotations

from collections.abc import Mapping

from autoscaler.config.errors import Refusal
from autoscaler.config.models import Config
from autoscaler.urls import UrlError, parse_url, transport

WATCH_BROKER_ENV = "AUTOSCALER_WATCH_BROKER_URL"
"""Where a queue's metrics are read when its config names no URL."""

CONTROL_BROKER_ENV = "AUTOSCALER_BROKER_URL"


def _redis_target(url: str) -> tuple[str, int, int] | None:
    """(host, port, db) of a Redis URL, None for another broker; UrlError for a bad URL."""
    parts = parse_url(url)
    if transport(url) != "redis" or parts.scheme == "unix":  # a socket path is no host:port
        return None
    return (parts.hostname or "localhost", parts.port or 6379, parts.db or 0)


def check_broker_isolation(
    config: Config, control_broker_url: str, control_prefix: str, env: Mapping[str, str]
) -> list[Refusal]:
    """Refusals for watched queues on our broker's Redis database and prefix, and for URLs
    (ours or a watched queue's, from the config or the environment) that cannot be parsed.

    A queue's URL is its `url`, else the variable named by `url_env`, else the watched-broker
    default (WATCH_BROKER_ENV) — the same resolution the metrics sources use.
    """
    try:
        ours = _redis_target(control_broker_url)
    except UrlError as exc:
        cause, _, fix = str(exc).partition("; ")
        return [
            Refusal(
                CONTROL_BROKER_ENV,
                f"the control plane's broker URL {cause}",
                f"correct ${CONTROL_BROKER_ENV}: {fix or 'give a valid URL'}",
            )
        ]
    refusals = []
    for name, queue in config.queues.items():
        var = queue.metrics.url_env or WATCH_BROKER_ENV
        url = queue.metrics.url or env.get(var)
        if url is None:
            continue
        try:
            target = _redis_target(url)
        except UrlError as exc:
            cause, _, fix = str(exc).partition("; ")
            if queue.metrics.url is not None:  # the model checked it already; kept for safety
                path, where = f"queues.{name}.metrics.url", "the watched URL"
            else:
                path, where = f"queues.{name}.metrics.url_env", f"the watched URL in ${var}"
            refusals.append(
                Refusal(path, f"{where} {cause}", f"correct it: {fix or 'give a valid URL'}")
            )
            continue
        if ours is None or target != ours:
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

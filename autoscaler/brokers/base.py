"""The one small interface every queue source implements, and the helpers they share.

A `MetricsReader` reads *many* queues of *one* source in one batch (one round trip where the
broker allows it): `read(queues) -> {queue: QueueMetrics}`. It returns a reading for every
queue asked for. A queue the broker does not know is an empty queue, not an error. When the
whole source cannot be read, `read` raises `SourceError`, whose message is already redacted;
`fallback.FallbackReader` turns that into stale last-known numbers for the tick.

No URL with a password, and no password, ever reaches a log line, an exception message or
`QueueMetrics.error`: sources keep their secrets in `Secrets` and pass every error text
through `Secrets.scrub` (or `safe_error`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from autoscaler.config.isolation import WATCH_BROKER_ENV
from autoscaler.config.metrics_sources import MetricsSource
from autoscaler.policy.snapshot import QueueMetrics
from autoscaler.settings import redact_url, url_secrets
from autoscaler.store.head_sightings import Mark as Mark
from autoscaler.store.head_sightings import MarksUpdate as MarksUpdate

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]

PUBLISHED_AT_HEADER = "x-autoscaler-published-at"
"""Message header holding the publish time (float seconds since the epoch), set by `stamp`."""


def utc_now() -> datetime:
    return datetime.now(UTC)


class SourceError(Exception):
    """The whole source could not be read. The message is redacted: safe to log and show."""


class MetricsConfigError(ValueError):
    """The source cannot be built; the message names the fix and holds no secret."""


def source_url(source: MetricsSource, env: Mapping[str, str] | None = None) -> str:
    """The broker URL of a `metrics:` block: its `url`, else the environment variable it names
    (`url_env`), else the watched broker of the environment (AUTOSCALER_WATCH_BROKER_URL)."""
    e = os.environ if env is None else env
    if source.url:
        return source.url
    name = source.url_env or WATCH_BROKER_ENV
    url = e.get(name)
    if not url:
        raise MetricsConfigError(
            f"no broker URL for this queue's metrics: set the environment variable {name}"
            + ("" if source.url_env else " or give 'url' / 'url_env' in the queue's metrics block")
        )
    return url


@runtime_checkable
class MetricsReader(Protocol):
    """Reads many queues of one source in one batch."""

    @property
    def source_id(self) -> str:
        """A stable, secret-free identity of the source (kind + redacted address)."""
        ...

    def read(self, queues: Sequence[str]) -> dict[str, QueueMetrics]:
        """One reading per queue asked for; raises `SourceError` if the source is unreadable."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Secrets:
    """The secret strings of one source; `scrub` removes them from any text."""

    values: tuple[str, ...] = ()

    @classmethod
    def from_urls(cls, *urls: str | None) -> Secrets:
        found: list[str] = []
        for url in urls:
            if url:
                found += [url, *url_secrets(url)]
        # longest first, so a URL is replaced whole before its password part
        uniq = sorted({s for s in found if len(s) >= 2}, key=len, reverse=True)
        return cls(tuple(uniq))

    def scrub(self, text: str) -> str:
        for secret in self.values:
            if secret in text:
                text = text.replace(secret, redact_url(secret) if "://" in secret else "***")
        return text


def safe_error(exc: BaseException, secrets: Secrets, context: str = "") -> str:
    """`Type: message` for an exception, every secret removed, at most 300 characters."""
    text = f"{type(exc).__name__}: {exc}"
    if context:
        text = f"{context}: {text}"
    text = secrets.scrub(text)
    return text if len(text) <= 300 else text[:297] + "..."


def age_from(published_at: float | None, now: datetime) -> float | None:
    """Seconds since an epoch timestamp; never negative (producer clocks may run ahead)."""
    if published_at is None:
        return None
    return max(0.0, now.timestamp() - published_at)


def max_age(ages: Iterable[float | None]) -> float | None:
    known = [a for a in ages if a is not None]
    return max(known) if known else None


@dataclass(frozen=True)
class HeadInfo:
    """What a source learns from one queue head message: its id and, if stamped, publish time."""

    message_id: str | None
    published_at: float | None


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def parse_celery_envelope(raw: bytes | str) -> HeadInfo:
    """Id and stamped publish time of a kombu/Celery JSON envelope (protocol 1 or 2).

    A message we cannot parse still has an identity: its raw bytes (hashed by the caller).
    """
    try:
        env = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return HeadInfo(None, None)
    if not isinstance(env, dict):
        return HeadInfo(None, None)
    headers = env.get("headers") or {}
    props = env.get("properties") or {}
    if not isinstance(headers, dict) or not isinstance(props, dict):
        return HeadInfo(None, None)
    msg_id = headers.get("id") or props.get("correlation_id") or props.get("delivery_tag")
    stamp = _as_float(headers.get(PUBLISHED_AT_HEADER))
    return HeadInfo(str(msg_id) if msg_id is not None else None, stamp)


@dataclass
class SightingsMemo:
    """In-memory head sightings and marks (used when no store is given; lost on restart)."""

    rows: dict[tuple[str, str], tuple[str, datetime]] = field(default_factory=dict)

    def observe(
        self, source: str, heads: dict[str, str | None], now: datetime
    ) -> dict[str, datetime]:
        seen: dict[str, datetime] = {}
        for key, msg_id in heads.items():
            if msg_id is None:
                self.rows.pop((source, key), None)
                continue
            prev = self.rows.get((source, key))
            if prev is None or prev[0] != msg_id:
                prev = (msg_id, now)
                self.rows[(source, key)] = prev
            seen[key] = prev[1]
        return seen

    def update_marks(self, source: str, keys: Sequence[str], update: MarksUpdate) -> None:
        prior = {k: self.rows[(source, k)] for k in keys if (source, k) in self.rows}
        for key, mark in update(prior).items():
            if mark is None:
                self.rows.pop((source, key), None)
            else:
                self.rows[(source, key)] = mark


class Sightings(Protocol):
    """Where first sightings of head message ids, and the age marks of `brokers.marks`, are kept
    (`store.head_sightings` persists them: restarts keep every bound)."""

    def observe(
        self, source: str, heads: dict[str, str | None], now: datetime
    ) -> dict[str, datetime]:
        """Record each key's current head id (None = empty); return first-seen times."""
        ...

    def update_marks(self, source: str, keys: Sequence[str], update: MarksUpdate) -> None:
        """Read the marks of `keys`, call `update` with them and store what it returns
        (None deletes), in one transaction."""
        ...


def failed_metrics(queue: str, now: datetime, error: str) -> QueueMetrics:
    """The reading of a queue whose key could not be read: stale, with the (redacted) error."""
    return QueueMetrics(
        queue=queue,
        pending=0,
        oldest_pending_age=None,
        in_flight=0,
        read_at=now,
        stale=True,
        error=error,
    )


def observe_safely(
    sightings: Sightings, source: str, heads: dict[str, str | None], now: datetime
) -> dict[str, datetime]:
    """Sightings are best effort: a store failure loses the age bound, never the reading."""
    try:
        return sightings.observe(source, heads, now)
    except Exception as exc:  # the store is down: report ages as unknown, keep the counts
        log.warning("head sightings of %s unavailable: %s", source, type(exc).__name__)
        return {}


@dataclass(frozen=True)
class ReaderBuild:
    """What a reader is built with beside its `metrics:` block (`registry.READERS`): the broker
    URL the block resolves to, where head sightings and marks are kept (None: in memory), the
    clock, and the timeout of one read."""

    url: str
    sightings: Sightings | None
    clock: Clock
    timeout: float

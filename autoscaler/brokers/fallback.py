"""What a tick sees when a source fails: the last known numbers, marked stale, for a while.

Rules (the policy relies on them):
- a failing source never raises out of `FallbackReader.read` and never crashes the tick;
- every reading that is not fresh has `stale=True` and an `error` saying why (redacted);
- within `max_age` of the last good reading, a stale reading carries those last numbers and
  their original `read_at` (so the age of the data is visible);
- past `max_age`, or with no good reading ever, it says pending=0, in_flight=0, age unknown,
  stale: nothing to scale up on, and - since the policy never scales down on a stale reading -
  nothing to scale down on either. Missing data holds the fleet where it is.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Generic, Protocol, TypeVar

from autoscaler.brokers.base import Clock, MetricsReader, SourceError, failed_metrics, utc_now
from autoscaler.policy.snapshot import QueueMetrics

log = logging.getLogger(__name__)

K = TypeVar("K")
V = TypeVar("V")


class LastKnown(Generic[K, V]):
    """A last-known-good cache whose entries are usable for `max_age` seconds."""

    def __init__(self, max_age: float) -> None:
        if max_age <= 0:
            raise ValueError("max_age must be positive")
        self.max_age = max_age
        self._items: dict[K, tuple[V, datetime]] = {}
        self._lock = threading.Lock()

    def put(self, key: K, value: V, at: datetime) -> None:
        with self._lock:
            self._items[key] = (value, at)

    def get(self, key: K, now: datetime) -> tuple[V, datetime] | None:
        """The last good value and when it was read, if not older than `max_age`."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            if (now - item[1]).total_seconds() > self.max_age:
                del self._items[key]
                return None
            return item


class LastReadings(Protocol):
    """Where a source's last good readings are kept: in this process, or in the state store
    (`store.metric_readings.StoredReadings`) so that every worker process falls back alike."""

    def save(self, source: str, readings: Mapping[str, QueueMetrics]) -> None: ...

    def load(self, source: str, queues: Sequence[str], since: datetime) -> dict[str, QueueMetrics]:
        """The last good reading of each queue read at or after `since` (others left out)."""
        ...


class MemoryReadings:
    """Last good readings in this process (tests, the simulator, a single-process run)."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, str], QueueMetrics] = {}
        self._lock = threading.Lock()

    def save(self, source: str, readings: Mapping[str, QueueMetrics]) -> None:
        with self._lock:
            for q, m in readings.items():
                self._items[(source, q)] = m

    def load(self, source: str, queues: Sequence[str], since: datetime) -> dict[str, QueueMetrics]:
        with self._lock:
            found = {q: self._items.get((source, q)) for q in queues}
        return {q: m for q, m in found.items() if m is not None and m.read_at >= since}


class FallbackReader:
    """Wraps any `MetricsReader`; `read` always returns one reading per queue, never raises."""

    def __init__(
        self,
        reader: MetricsReader,
        max_age: float,
        clock: Clock = utc_now,
        last: LastReadings | None = None,
    ) -> None:
        if max_age <= 0:
            raise ValueError("max_age must be positive")
        self.reader = reader
        self.max_age = max_age
        self._clock = clock
        self._last = last if last is not None else MemoryReadings()

    @property
    def source_id(self) -> str:
        return self.reader.source_id

    def read(self, queues: Sequence[str]) -> dict[str, QueueMetrics]:
        failure: str | None = None
        try:
            fresh = self.reader.read(queues)
        except SourceError as exc:
            failure = str(exc)
            fresh = {}
        except Exception as exc:  # a bug or an unexpected library error: the type only,
            failure = f"{self.reader.source_id}: {type(exc).__name__}"  # its text may hold a URL
            fresh = {}
        if failure:
            log.warning("metrics source failed, using last known numbers: %s", failure)
        now = self._clock()
        asked = set(queues)  # (a list: `in` over 10,000 queues cost 0.5 s a tick)
        good = {q: m for q, m in fresh.items() if q in asked and not m.stale}
        if good:
            self._last.save(self.source_id, good)
        failed = [q for q in queues if q not in good]
        last = (
            self._last.load(self.source_id, failed, now - timedelta(seconds=self.max_age))
            if failed
            else {}
        )
        out: dict[str, QueueMetrics] = {}
        for q in queues:
            if q in good:
                out[q] = good[q]
                continue
            got = fresh.get(q)
            reason = (got.error if got is not None else None) or failure or "no reading"
            known = last.get(q)
            if known is not None:
                out[q] = replace(known, stale=True, error=reason)
            else:
                out[q] = failed_metrics(q, now, reason)
        return out

    def close(self) -> None:
        self.reader.close()

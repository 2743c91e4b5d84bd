"""Prometheus instant queries for the `metric` trigger (e.g. requests waiting in an inference
server), with a timeout and the same last-known-good fallback as the queue sources.

`GET {url}/api/v1/query?query=...&timeout=...`: a scalar answer is its value; a vector answer is
the sum of its samples. An empty vector, NaN or an error is *no value*, never zero (a missing
series must not read as "no demand": write `sum(x) or vector(0)` if zero is meant).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests

from autoscaler.brokers.base import Clock, Secrets, SourceError, safe_error, utc_now
from autoscaler.brokers.fallback import LastKnown
from autoscaler.policy.snapshot import QueueMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromSample:
    """One query's value at `read_at`; `stale` with `error` when it is the last known value."""

    query: str
    value: float | None
    read_at: datetime
    stale: bool = False
    error: str | None = None


class PrometheusReader:
    """Instant queries against one Prometheus; `read` never raises."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 5.0,
        max_age: float = 300.0,
        clock: Clock = utc_now,
    ) -> None:
        self._secrets = Secrets.from_urls(url)
        parts = urlsplit(url)
        self._auth = (parts.username, parts.password or "") if parts.username else None
        netloc = parts.hostname or ""
        if parts.port:
            netloc = f"{netloc}:{parts.port}"
        self._base = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        self._timeout = timeout
        self._clock = clock
        self._http = requests.Session()
        self._last: LastKnown[str, float] = LastKnown(max_age)
        self.source_id = f"prometheus:{self._base}"

    def query(self, query: str) -> float:
        """The value of one instant query; raises SourceError (redacted) when there is none."""
        try:
            resp = self._http.get(
                f"{self._base}/api/v1/query",
                params={"query": query, "timeout": f"{self._timeout:g}s"},
                auth=self._auth,
                timeout=self._timeout,
            )
        except requests.RequestException as exc:
            raise SourceError(safe_error(exc, self._secrets, self.source_id)) from None
        try:
            body: Any = resp.json()
        except ValueError:
            body = None
        if resp.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
            detail = body.get("error") if isinstance(body, dict) else None
            raise SourceError(
                self._secrets.scrub(
                    f"{self.source_id}: HTTP {resp.status_code}" + (f": {detail}" if detail else "")
                )[:300]
            )
        value = _value(body.get("data"))
        if value is None:
            raise SourceError(f"{self.source_id}: no value (empty result or NaN) for {query!r}")
        return value

    def read(self, queries: Sequence[str]) -> dict[str, PromSample]:
        """Each query's value; a failing query gets its last value (stale) or none (stale)."""
        out: dict[str, PromSample] = {}
        for q in dict.fromkeys(queries):
            try:
                value = self.query(q)
            except SourceError as exc:
                now = self._clock()
                log.warning("prometheus query failed: %s", exc)
                last = self._last.get(q, now)
                if last is not None:
                    out[q] = PromSample(q, last[0], last[1], stale=True, error=str(exc))
                else:
                    out[q] = PromSample(q, None, now, stale=True, error=str(exc))
                continue
            now = self._clock()
            self._last.put(q, value, now)
            out[q] = PromSample(q, value, now)
        return out

    def close(self) -> None:
        self._http.close()


def with_external(metrics: QueueMetrics, readings: Sequence[PromSample]) -> QueueMetrics:
    """A queue's reading with its `metric` trigger values in `external`.

    A last-known (stale) value is kept for scale-up; a query that is stale or has no value is
    named in `external_degraded`, which stops scale-down only. The queue's own numbers stay
    fresh: a failing Prometheus must not stop scale-from-zero on a queue that has jobs.
    """
    external = tuple((r.query, r.value) for r in readings if r.value is not None)
    degraded = tuple(r.query for r in readings if r.stale or r.value is None)
    reasons = "; ".join(
        r.error or f"{r.query!r} has no current value" for r in readings if r.query in degraded
    )
    error = "; ".join(e for e in (metrics.error, reasons) if e) or None
    return replace(
        metrics, external=external, external_degraded=degraded, error=error[:500] if error else None
    )


def _value(data: Any) -> float | None:
    if not isinstance(data, dict):
        return None
    kind, result = data.get("resultType"), data.get("result")
    try:
        if kind == "scalar" and isinstance(result, list):
            values = [float(result[1])]
        elif kind == "vector" and isinstance(result, list):
            values = [float(s["value"][1]) for s in result]
        else:
            return None
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    if not values or any(math.isnan(v) or math.isinf(v) for v in values):
        return None
    return float(sum(values))

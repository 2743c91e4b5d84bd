"""Live workers: Celery workers seen through the broker, merged with the agent's machines.

Hand-made machines (a worker someone started by hand) have no agent and no row in the store;
the broker is the only place they show. `CeleryWorkerProbe` broadcasts `active_queues` through
the watched broker (a control-only Celery app: it never consumes the watched queues, so it
cannot requeue the watched app's unacked messages) and learns which worker consumes which queue.

A reply proves a worker alive; no reply does not prove it dead (a busy solo pool cannot answer).
`WorkerTracker` therefore keeps the last time each worker was seen and counts it live until its
heartbeat window passes without news (Celery: 2 x the 2 s heartbeat for event heartbeats; for
inspect replies, the window the caller chooses, a few poll intervals). A worker silent past its
window is not live.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from celery import Celery

from autoscaler.metrics.base import Clock, Secrets, SourceError, safe_error, utc_now
from autoscaler.policy.snapshot import QueueMetrics

HEARTBEAT_WINDOW = 4.0
"""Seconds without a heartbeat after which a Celery worker is dead (2 x the 2 s default)."""


@dataclass(frozen=True)
class WorkerSeen:
    name: str
    queues: tuple[str, ...]
    seen_at: datetime
    window: float


class WorkerTracker:
    """Last sighting per worker; `live` lists those heard from within their window."""

    def __init__(self, window: float) -> None:
        if window <= 0:
            raise ValueError("window must be positive")
        self.window = window
        self._seen: dict[str, WorkerSeen] = {}
        self._lock = threading.Lock()

    def observe(
        self, name: str, queues: Iterable[str] | None, now: datetime, window: float | None = None
    ) -> None:
        """A sign of life; `queues=None` keeps the queues known from an earlier sighting."""
        with self._lock:
            prev = self._seen.get(name)
            qs = tuple(queues) if queues is not None else (prev.queues if prev else ())
            self._seen[name] = WorkerSeen(name, qs, now, window or self.window)

    def observe_replies(self, replies: Mapping[str, Iterable[str]], now: datetime) -> None:
        for name, queues in replies.items():
            self.observe(name, queues, now)

    def live(self, now: datetime) -> dict[str, tuple[str, ...]]:
        """Queue -> names of live workers consuming it (sorted); silent ones are dropped."""
        out: dict[str, list[str]] = {}
        with self._lock:
            for name, w in list(self._seen.items()):
                if now - w.seen_at > timedelta(seconds=w.window):
                    del self._seen[name]
                    continue
                for q in w.queues:
                    out.setdefault(q, []).append(name)
        return {q: tuple(sorted(names)) for q, names in out.items()}


class CeleryWorkerProbe:
    """Asks every Celery worker on a broker which queues it consumes (one broadcast)."""

    def __init__(
        self,
        broker_url: str,
        *,
        transport_options: Mapping[str, Any] | None = None,
        timeout: float = 1.0,
    ) -> None:
        self._secrets = Secrets.from_urls(broker_url)
        self._app = Celery("autoscaler-probe", broker=broker_url, set_as_current=False)
        self._app.conf.broker_transport_options = dict(transport_options or {})
        self._app.conf.broker_connection_retry_on_startup = False
        self._app.conf.broker_connection_timeout = timeout
        self._timeout = timeout

    def poll(self) -> dict[str, tuple[str, ...]]:
        """Worker name -> queues it consumes, for every worker that answered in time."""
        try:
            replies = self._app.control.inspect(timeout=self._timeout).active_queues() or {}
        except Exception as exc:  # kombu raises many types; the text is scrubbed
            raise SourceError(safe_error(exc, self._secrets, "celery worker probe")) from None
        out: dict[str, tuple[str, ...]] = {}
        for name, queues in replies.items():
            if isinstance(queues, list):
                out[name] = tuple(
                    str(q["name"]) for q in queues if isinstance(q, dict) and "name" in q
                )
        return out

    def status(self) -> dict[str, tuple[tuple[str, ...], int]]:
        """Worker name -> (queues it consumes, tasks running), for every worker that answered.

        Two broadcasts: `active_queues` proves a worker alive, `active` says if it is busy (a
        worker that answered the first but not the second counts as busy: never idle by doubt).
        """
        queues = self.poll()
        try:
            active = self._app.control.inspect(timeout=self._timeout).active() or {}
        except Exception as exc:
            raise SourceError(safe_error(exc, self._secrets, "celery worker probe")) from None
        out: dict[str, tuple[tuple[str, ...], int]] = {}
        for name, qs in queues.items():
            running = active.get(name)
            out[name] = (qs, len(running) if isinstance(running, list) else 1)
        return out

    def worker_state(self, worker: str) -> tuple[tuple[str, ...], int] | None:
        """(queues consumed, tasks running or reserved) of one worker; None if it did not answer.

        Reserved (prefetched) tasks count: they would start once the running one ends."""
        try:
            insp = self._app.control.inspect(destination=[worker], timeout=self._timeout, limit=1)
            queues = (insp.active_queues() or {}).get(worker)
            if queues is None:
                return None
            active = (insp.active() or {}).get(worker)
            reserved = (insp.reserved() or {}).get(worker)
        except Exception as exc:
            raise SourceError(safe_error(exc, self._secrets, "celery worker probe")) from None
        names = tuple(str(q["name"]) for q in queues if isinstance(q, dict) and "name" in q)
        if not isinstance(active, list) or not isinstance(reserved, list):
            return names, 1  # could not tell: count it busy
        return names, len(active) + len(reserved)

    def cancel_consumer(self, worker: str, queue: str) -> None:
        """Ask one worker to stop taking jobs from `queue` (confirm with `worker_state`)."""
        try:
            self._app.control.cancel_consumer(
                queue, destination=[worker], reply=True, timeout=self._timeout
            )
        except Exception as exc:
            raise SourceError(safe_error(exc, self._secrets, "celery cancel_consumer")) from None

    def shutdown(self, worker: str) -> None:
        """Warm shutdown of one worker: it finishes what runs, then exits."""
        try:
            self._app.control.shutdown(destination=[worker])
        except Exception as exc:
            raise SourceError(safe_error(exc, self._secrets, "celery shutdown")) from None

    def close(self) -> None:
        self._app.close()


class BrokerWorkers:
    """Probe + tracker: live broker-seen workers per queue; a failed probe keeps old sightings
    until their window runs out (then they are no longer live)."""

    def __init__(self, probe: CeleryWorkerProbe, window: float, clock: Clock = utc_now) -> None:
        self.probe = probe
        self.tracker = WorkerTracker(window)
        self._clock = clock
        self.last_error: str | None = None

    def read(self) -> dict[str, tuple[str, ...]]:
        try:
            replies = self.probe.poll()
            self.last_error = None
        except SourceError as exc:
            replies = {}
            self.last_error = str(exc)
        now = self._clock()
        self.tracker.observe_replies(replies, now)
        return self.tracker.live(now)


def host_of(worker: str) -> str:
    """`celery@gpu-1` -> `gpu-1`: Celery names a worker `<name>@<host>`; agents report hosts."""
    return worker.rsplit("@", 1)[-1].strip().lower()


def merge_live_workers(agent: Iterable[str], broker: Iterable[str]) -> tuple[str, ...]:
    """Live workers of a queue: agent-reported machines plus broker-seen workers, one per host.

    Deduplicated by host (`host_of`), so a rented machine whose worker the broker also sees
    counts once, and a hand-made machine (broker only) counts too. The agent's name wins.
    """
    out: dict[str, str] = {}
    for name in agent:
        out.setdefault(host_of(name), name)
    for name in broker:
        out.setdefault(host_of(name), name)
    return tuple(sorted(out.values()))


def hand_made(agent: Iterable[str], broker: Iterable[str]) -> tuple[str, ...]:
    """Broker-seen workers on hosts our agent does not report: `QueueSnapshot.manual_workers`
    is the length of this (capacity never drained by us)."""
    ours = {host_of(n) for n in agent}
    out: dict[str, str] = {}
    for name in broker:
        if host_of(name) not in ours:
            out.setdefault(host_of(name), name)
    return tuple(sorted(out.values()))


def with_broker_workers(
    metrics: Mapping[str, QueueMetrics], workers: Mapping[str, tuple[str, ...]]
) -> dict[str, QueueMetrics]:
    """The readings with `broker_workers` filled from a `BrokerWorkers.read()` answer."""
    return {q: replace(m, broker_workers=workers.get(q, ())) for q, m in metrics.items()}

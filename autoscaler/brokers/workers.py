"""Live workers: Celery workers seen through the broker.

Hand-made machines (a worker someone started by hand) have no agent and no machine row;
the broker is the only place they show. `CeleryWorkerProbe` broadcasts `active_queues` through
the watched broker (a control-only Celery app: it never consumes the watched queues, so it
cannot requeue the watched app's unacked messages) and learns which worker consumes which queue;
`status` also asks `active`, `reserved` and `scheduled` and says, per queue, how many jobs each
worker runs, holds prefetched and holds until their ETA (`QueueLoad`): the running count the
broker cannot give (with Celery's default early acks a running job is acked already).

A reply proves a worker alive; no reply does not prove it dead (a busy solo pool cannot answer).
So what answered is kept in the store (`worker_sightings`, written by `control.observe`) and
counts as live until its window passes without news (`control.observe.read_sightings`); a
worker silent past its window is not live.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from celery import Celery

from autoscaler.brokers.base import Secrets, SourceError, safe_error
from autoscaler.brokers.redis.heads import parse_eta
from autoscaler.brokers.remote_control import BoundedControl
from autoscaler.policy.snapshot import QueueMetrics


@dataclass(frozen=True)
class QueueLoad:
    """Jobs of one queue a worker (or all workers) reported: running, prefetched and not started
    (due), held until a future ETA, and the earliest of those ETAs (epoch seconds)."""

    running: int = 0
    reserved: int = 0
    scheduled: int = 0
    next_due: float | None = None

    def __add__(self, other: QueueLoad) -> QueueLoad:
        dues = [t for t in (self.next_due, other.next_due) if t is not None]
        return QueueLoad(
            self.running + other.running,
            self.reserved + other.reserved,
            self.scheduled + other.scheduled,
            min(dues) if dues else None,
        )

    def as_json(self) -> list[object]:
        return [self.running, self.reserved, self.scheduled, self.next_due]

    @classmethod
    def from_json(cls, value: object) -> QueueLoad | None:
        if not isinstance(value, list) or len(value) != 4:
            return None
        r, p, s, d = value
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (r, p, s)):
            return None
        due = float(d) if isinstance(d, int | float) and not isinstance(d, bool) else None
        return cls(int(r), int(p), int(s), due)


@dataclass(frozen=True)
class WorkerStatus:
    """One worker's answer: the queues it consumes, how many tasks it runs (all queues), and
    per consumed queue what it runs, holds and has scheduled (`loads` is None when the worker
    answered `active_queues` but not `active`: it then counts busy, its load unknown)."""

    queues: tuple[str, ...]
    running: int
    loads: Mapping[str, QueueLoad] | None = None


def _consumed(queues: list[Any]) -> list[tuple[str, str, str, str]]:
    """(queue, exchange, exchange type, binding key) for every binding of every consumed queue,
    from an `active_queues` reply."""
    out = []
    for q in queues:
        if not isinstance(q, dict) or "name" not in q:
            continue
        name = str(q["name"])
        ex = q.get("exchange")
        ex = ex if isinstance(ex, dict) else {}
        out.append(
            (
                name,
                str(ex.get("name") or ""),
                str(ex.get("type") or "direct"),
                str(q.get("routing_key") or ""),
            )
        )
        for b in q.get("bindings") or ():
            if isinstance(b, dict):
                out.append(
                    (name, str(b.get("exchange") or ""), "direct", str(b.get("routing_key") or ""))
                )
    return out


def _topic(pattern: str, key: str) -> bool:
    """AMQP topic matching: `*` one word, `#` zero or more words."""

    def match(p: list[str], k: list[str]) -> bool:
        if not p:
            return not k
        if p[0] == "#":
            return any(match(p[1:], k[i:]) for i in range(len(k) + 1))
        return bool(k) and (p[0] == "*" or p[0] == k[0]) and match(p[1:], k[1:])

    return match(pattern.split("."), key.split("."))


def queue_of_task(task: Any, consumed: list[tuple[str, str, str, str]]) -> str | None:
    """Which consumed queue a task from an `active` / `reserved` reply came from, by its
    delivery info: the anonymous exchange routes by queue name, a named one by its bindings
    (equal keys, or topic patterns); a worker consuming one queue only has it from there."""
    names = list(dict.fromkeys(c[0] for c in consumed))
    info = task.get("delivery_info") if isinstance(task, dict) else None
    if isinstance(info, dict):
        exchange = str(info.get("exchange") or "")
        rk = str(info.get("routing_key") or "")
        if not exchange and rk in names:
            return rk
        for name, ex, kind, key in consumed:
            if ex == exchange and (key == rk or (kind == "topic" and _topic(key, rk))):
                return name
        if not exchange:
            return None if len(names) != 1 else names[0]
    return names[0] if len(names) == 1 else None


class CeleryWorkerProbe:
    """Asks every Celery worker on a broker which queues it consumes (one broadcast) and, for
    `status`, what it runs, holds and has scheduled (`active`, then `reserved` and `scheduled`,
    each returning as soon as every worker that answered `active` has answered)."""

    def __init__(
        self,
        broker_url: str,
        *,
        transport_options: Mapping[str, Any] | None = None,
        timeout: float = 1.0,
    ) -> None:
        self._secrets = Secrets.from_urls(broker_url)
        self._app = Celery(
            "autoscaler-probe", broker=broker_url, set_as_current=False, control=BoundedControl
        )
        self._app.conf.broker_transport_options = dict(transport_options or {})
        self._app.conf.broker_connection_retry_on_startup = False
        self._app.conf.broker_connection_timeout = timeout
        self._timeout = timeout

    def _replies(self) -> dict[str, list[Any]]:
        try:
            replies = self._app.control.inspect(timeout=self._timeout).active_queues() or {}
        except Exception as exc:  # kombu raises many types; the text is scrubbed
            raise SourceError(safe_error(exc, self._secrets, "celery worker probe")) from None
        return {name: qs for name, qs in replies.items() if isinstance(qs, list)}

    def poll(self) -> dict[str, tuple[str, ...]]:
        """Worker name -> queues it consumes, for every worker that answered in time."""
        return {
            name: tuple(str(q["name"]) for q in queues if isinstance(q, dict) and "name" in q)
            for name, queues in self._replies().items()
        }

    def status(self) -> dict[str, WorkerStatus]:
        """Worker name -> `WorkerStatus`, for every worker that answered `active_queues`.

        A worker that answered it but not `active` counts as busy (never idle by doubt) with an
        unknown load; one that did not answer `reserved` or `scheduled` has those counted 0."""
        consumed = {name: _consumed(qs) for name, qs in self._replies().items()}
        try:
            # `active` waits its whole timeout, as it always did (a reconcile's pace is part of
            # what the loop was tuned with); the task lists after it return as soon as every
            # worker that answered it has answered them
            active = self._app.control.inspect(timeout=self._timeout).active() or {}
            answered = [n for n in consumed if isinstance(active.get(n), list)]
            reserved: dict[str, Any] = {}
            scheduled: dict[str, Any] = {}
            if answered:
                insp = self._app.control.inspect(timeout=self._timeout, limit=len(answered))
                reserved = insp.reserved() or {}
                scheduled = insp.scheduled() or {}
        except Exception as exc:
            raise SourceError(safe_error(exc, self._secrets, "celery worker probe")) from None
        out: dict[str, WorkerStatus] = {}
        for name, bindings in consumed.items():
            queues = tuple(dict.fromkeys(b[0] for b in bindings))
            running = active.get(name)
            if not isinstance(running, list):
                out[name] = WorkerStatus(queues, 1)
                continue
            loads: dict[str, QueueLoad] = {q: QueueLoad() for q in queues}
            held = reserved.get(name)
            later = scheduled.get(name)
            tasks = [
                *((t, QueueLoad(running=1)) for t in running),
                *((t, QueueLoad(reserved=1)) for t in (held if isinstance(held, list) else ())),
                *(
                    (e.get("request"), QueueLoad(scheduled=1, next_due=parse_eta(e.get("eta"))))
                    for e in (later if isinstance(later, list) else ())
                    if isinstance(e, dict)
                ),
            ]
            for task, load in tasks:
                q = queue_of_task(task, bindings)
                if q is not None:
                    loads[q] = loads.get(q, QueueLoad()) + load
            out[name] = WorkerStatus(queues, len(running), loads)
        return out

    def worker_state(self, worker: str) -> tuple[tuple[str, ...], int] | None:
        """(queues consumed, tasks it holds) of one worker; None if it did not answer.

        Held means running, reserved (prefetched: they start once the running one ends) or
        scheduled (an ETA / countdown job the worker took and keeps until due, which Celery
        lists apart from both): a warm shutdown with any of them would leave it on a machine
        about to be destroyed."""
        try:
            insp = self._app.control.inspect(destination=[worker], timeout=self._timeout, limit=1)
            queues = (insp.active_queues() or {}).get(worker)
            if queues is None:
                return None
            held = [
                (insp.active() or {}).get(worker),
                (insp.reserved() or {}).get(worker),
                (insp.scheduled() or {}).get(worker),
            ]
        except Exception as exc:
            raise SourceError(safe_error(exc, self._secrets, "celery worker probe")) from None
        names = tuple(str(q["name"]) for q in queues if isinstance(q, dict) and "name" in q)
        if not all(isinstance(tasks, list) for tasks in held):
            return names, 1  # could not tell: count it busy
        return names, sum(len(tasks) for tasks in held if isinstance(tasks, list))

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


def host_of(worker: str) -> str:
    """`celery@gpu-1` -> `gpu-1`: Celery names a worker `<name>@<host>`; agents report hosts."""
    return worker.rsplit("@", 1)[-1].strip().lower()


def with_worker_loads(metrics: QueueMetrics, load: QueueLoad | None) -> QueueMetrics:
    """A reading completed with what the workers reported for its queue (None: no report).

    `running` and `reserved` come from the workers. ETA jobs a worker holds are unacked at the
    broker: those the source did not already count as scheduled (`scheduled_held`; RabbitMQ
    cannot see them) move from `in_flight` to `scheduled`."""
    if load is None:
        return metrics
    extra = max(0, load.scheduled - metrics.scheduled_held)
    dues = [t for t in (metrics.next_due_at, load.next_due) if t is not None]
    return replace(
        metrics,
        running=load.running,
        reserved=load.reserved,
        in_flight=max(0, metrics.in_flight - extra),
        scheduled=metrics.scheduled + extra,
        scheduled_held=metrics.scheduled_held + extra,
        next_due_at=min(dues) if dues else None,
    )

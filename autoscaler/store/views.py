"""Read-only operator views of the store: per queue, per machine, spend, the audit trail.

Shared by `autoscaler status / instances / events` and usable by the API's admin endpoints and
the dashboard. Nothing here writes (expired manual targets are skipped, not deleted), and each
view is a fixed number of queries whatever the number of queues or machines.

Money: a machine bills from the moment the provider created it (`booting_at`; a row still
`pending` or `creating` has no machine yet) until it was terminated, lost or failed (or now, if
it may still bill), at its **real** price (`instances.price_per_hour`: the price the provider
reported for the machine, else the offer's), never the queue's cap. A machine of unknown price
adds nothing to a sum and is counted in `unknown_price` instead. "Today" is the UTC day.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from autoscaler.lifecycle import LIVE_STATES, InstanceState
from autoscaler.store import config_versions
from autoscaler.store.models import (
    Instance,
    ManualTarget,
    MetricReading,
    QueueStatus,
    RentalBackoff,
    ScaleEvent,
)

S = InstanceState
BOOTING_STATES = (S.PENDING, S.CREATING, S.BOOTING)
LEAVING_STATES = (S.DRAINING, S.DRAINED, S.TERMINATING)


# ------------------------------------------------------------------------------ records


@dataclass(frozen=True)
class InstanceView:
    launch_id: str
    queue: str
    provider: str
    provider_instance_id: str | None
    gpu: str | None
    state: str
    state_reason: str | None
    busy: bool
    running_tasks: int
    idle_seconds: float | None
    """Seconds since its last task (or since ready) for a ready idle machine; else None."""
    drain_requested: bool
    age_seconds: float
    price_per_hour: float | None
    billed_seconds: float
    cost_so_far: float | None
    last_heartbeat_at: datetime | None
    created_at: datetime

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("last_heartbeat_at", "created_at"):
            value = data[key]
            data[key] = value.isoformat() if value else None
        data["cost_so_far"] = None if self.cost_so_far is None else round(self.cost_so_far, 6)
        return data


@dataclass(frozen=True)
class BackoffView:
    provider: str
    failures: int
    until: datetime
    last_error: str | None

    def as_json(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "failures": self.failures,
            "until": self.until.isoformat(),
            "last_error": self.last_error,
        }


@dataclass(frozen=True)
class TargetView:
    workers: int
    until: datetime
    set_by: str

    def as_json(self) -> dict[str, Any]:
        return {"workers": self.workers, "until": self.until.isoformat(), "set_by": self.set_by}


@dataclass
class QueueView:
    queue: str
    pending: int | None = None
    oldest_age_seconds: float | None = None
    running: int | None = None
    scheduled: int | None = None
    reading_at: datetime | None = None
    reading_stale: bool = False
    reading_error: str | None = None
    live: int = 0
    busy: int = 0
    booting: int = 0
    draining: int = 0
    desired: int | None = None
    capacity: int | None = None
    floor: int | None = None
    ceiling: int | None = None
    evaluated_at: datetime | None = None
    why: list[str] = field(default_factory=list)
    waits: list[dict[str, Any]] = field(default_factory=list)
    backoffs: list[BackoffView] = field(default_factory=list)
    manual_target: TargetView | None = None
    spend_per_hour: float = 0.0
    autoscaled: bool = True

    def as_json(self) -> dict[str, Any]:
        def t(v: datetime | None) -> str | None:
            return v.isoformat() if v else None

        return {
            "queue": self.queue,
            "autoscaled": self.autoscaled,
            "pending": self.pending,
            "oldest_age_seconds": self.oldest_age_seconds,
            "running": self.running,
            "scheduled": self.scheduled,
            "reading_at": t(self.reading_at),
            "reading_stale": self.reading_stale,
            "reading_error": self.reading_error,
            "workers": {
                "live": self.live,
                "busy": self.busy,
                "booting": self.booting,
                "draining": self.draining,
            },
            "desired": self.desired,
            "capacity": self.capacity,
            "floor": self.floor,
            "ceiling": self.ceiling,
            "evaluated_at": t(self.evaluated_at),
            "why": list(self.why),
            "waits": list(self.waits),
            "backoffs": [b.as_json() for b in self.backoffs],
            "manual_target": self.manual_target.as_json() if self.manual_target else None,
            "spend_per_hour": round(self.spend_per_hour, 6),
        }


@dataclass(frozen=True)
class Spend:
    rate_per_hour: float
    """Σ real price of every machine that may still bill."""
    today: float
    """What every machine billed since 00:00 UTC today, up to now."""
    unknown_price: int
    """Machines that may bill and whose price is unknown (not in the sums)."""
    day_start: datetime

    def as_json(self) -> dict[str, Any]:
        return {
            "rate_per_hour": round(self.rate_per_hour, 6),
            "today": round(self.today, 6),
            "unknown_price": self.unknown_price,
            "day_start": self.day_start.isoformat(),
        }


@dataclass(frozen=True)
class EventView:
    id: int
    at: datetime
    queue: str | None
    kind: str
    action: str
    launch_id: str | None
    reason: str
    details: dict[str, Any] | None

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "at": self.at.isoformat()}


# ------------------------------------------------------------------------------ money


def billing_interval(row: Instance, now: datetime) -> tuple[datetime, datetime] | None:
    """When the machine of `row` billed: from its create at the provider to its end."""
    start = row.booting_at or row.ready_at
    if start is None:
        return None
    if row.state in LIVE_STATES:
        end = now
    else:
        ends = [t for t in (row.terminated_at, row.lost_at, row.failed_at) if t is not None]
        end = min(ends) if ends else row.updated_at
    return (start, max(start, min(end, now)))


def _cost(price: float | None, seconds: float) -> float | None:
    return None if price is None else price * seconds / 3600.0


def day_start(now: datetime) -> datetime:
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


# ------------------------------------------------------------------------------ views


def _instance_view(row: Instance, now: datetime) -> InstanceView:
    interval = billing_interval(row, now)
    billed = (interval[1] - interval[0]).total_seconds() if interval else 0.0
    busy = row.running_tasks > 0 and row.state in (S.READY, S.DRAINING)
    idle: float | None = None
    if row.state == S.READY and not busy:
        since = max((t for t in (row.last_task_at, row.ready_at) if t is not None), default=None)
        idle = max(0.0, (now - since).total_seconds()) if since else None
    return InstanceView(
        launch_id=row.launch_id,
        queue=row.queue,
        provider=row.provider,
        provider_instance_id=row.provider_instance_id,
        gpu=row.gpu,
        state=row.state.value,
        state_reason=row.state_reason,
        busy=busy,
        running_tasks=row.running_tasks,
        idle_seconds=idle,
        drain_requested=row.drain_requested,
        age_seconds=max(0.0, (now - row.created_at).total_seconds()),
        price_per_hour=row.price_per_hour,
        billed_seconds=billed,
        cost_so_far=_cost(row.price_per_hour, billed) if interval else 0.0,
        last_heartbeat_at=row.last_heartbeat_at,
        created_at=row.created_at,
    )


def instances(
    session: Session,
    now: datetime,
    *,
    queue: str | None = None,
    states: Collection[InstanceState] | None = None,
    include_closed: bool = False,
    limit: int = 500,
) -> list[InstanceView]:
    """Machines, oldest first: those that may still bill, or (`include_closed`) the newest
    `limit` of any state. One query."""
    q = select(Instance)
    if states:
        q = q.where(Instance.state.in_(list(states)))
    elif not include_closed:
        q = q.where(Instance.state.in_(LIVE_STATES))
    if queue is not None:
        q = q.where(Instance.queue == queue)
    rows = list(session.scalars(q.order_by(Instance.id.desc()).limit(limit)))
    return [_instance_view(r, now) for r in reversed(rows)]


def spend(session: Session, now: datetime) -> Spend:
    """Spend rate now and what was billed today (one query: rows that may bill or billed
    today)."""
    start = day_start(now)
    rows = session.scalars(
        select(Instance).where(
            or_(
                Instance.state.in_(LIVE_STATES),
                Instance.terminated_at >= start,
                Instance.lost_at >= start,
                Instance.failed_at >= start,
                Instance.updated_at >= start,
            )
        )
    )
    rate = today = 0.0
    unknown = 0
    for row in rows:
        live = row.state in LIVE_STATES and row.booting_at is not None
        if row.price_per_hour is None:
            unknown += 1 if live else 0
            continue
        if live:
            rate += row.price_per_hour
        interval = billing_interval(row, now)
        if interval is None:
            continue
        lo, hi = max(interval[0], start), interval[1]
        if hi > lo:
            today += row.price_per_hour * (hi - lo).total_seconds() / 3600.0
    return Spend(rate, today, unknown, start)


def _broker_queues(document: dict[str, Any] | None) -> dict[str, tuple[str, bool]]:
    """Config queue -> (the broker queue its metrics read, autoscaled?) from a config document."""
    out: dict[str, tuple[str, bool]] = {}
    for name, cfg in ((document or {}).get("queues") or {}).items():
        cfg = cfg if isinstance(cfg, dict) else {}
        metrics = cfg.get("metrics")
        metrics = metrics if isinstance(metrics, dict) else {}
        out[str(name)] = (str(metrics.get("queue") or name), cfg.get("autoscale") is not None)
    return out


def queues(
    session: Session,
    now: datetime,
    *,
    machines: Iterable[InstanceView] | None = None,
    only: str | None = None,
) -> list[QueueView]:
    """Every queue of the newest config, of the latest evaluations and of live machines: its
    last good reading, machines by kind, what the latest evaluation wants and why, backoffs
    in force and the manual target. A fixed number of queries."""
    latest = config_versions.latest(session)
    configured = _broker_queues(latest.document if latest else None)
    status = statuses(session)
    rows = list(machines) if machines is not None else instances(session, now)
    names = set(configured) | set(status) | {m.queue for m in rows}
    if only is not None:
        names &= {only}
    views = {n: QueueView(n, autoscaled=configured.get(n, (n, True))[1]) for n in names}

    readings: dict[str, tuple[datetime, dict[str, Any]]] = {}
    for q, reading, read_at in session.execute(
        select(MetricReading.queue, MetricReading.reading, MetricReading.read_at)
    ):
        if q not in readings or read_at > readings[q][0]:
            readings[q] = (read_at, reading if isinstance(reading, dict) else {})
    for name, view in views.items():
        found = readings.get(configured.get(name, (name, True))[0]) or readings.get(name)
        if found is None:
            continue
        read_at, data = found
        view.reading_at = read_at
        view.pending = _int(data.get("pending"))
        age = data.get("oldest_pending_age")
        if isinstance(age, int | float) and view.pending:
            view.oldest_age_seconds = float(age) + max(0.0, (now - read_at).total_seconds())
        view.running = _int(data.get("running"))
        view.scheduled = _int(data.get("scheduled"))
        view.reading_stale = bool(data.get("stale"))
        view.reading_error = data.get("error") if isinstance(data.get("error"), str) else None

    for m in rows:
        mview = views.get(m.queue)
        if mview is None:
            continue
        state = InstanceState(m.state)
        if state == S.READY:
            mview.live += 1
            mview.busy += 1 if m.busy else 0
        elif state in BOOTING_STATES:
            mview.booting += 1
        elif state in LEAVING_STATES:
            mview.draining += 1
        if m.price_per_hour is not None and m.billed_seconds > 0 and state in LIVE_STATES:
            mview.spend_per_hour += m.price_per_hour

    for name, st in status.items():
        sview = views.get(name)
        if sview is None:
            continue
        data = st.status if isinstance(st.status, dict) else {}
        sview.evaluated_at = st.evaluated_at
        sview.desired = _int(data.get("desired"))
        sview.capacity = _int(data.get("capacity"))
        sview.floor = _int(data.get("floor"))
        sview.ceiling = _int(data.get("ceiling"))
        sview.waits = [w for w in data.get("waits") or [] if isinstance(w, dict)]
        sview.why = [str(w.get("reason")) for w in sview.waits if w.get("reason")] + [
            str(n) for n in data.get("notes") or []
        ]

    for b in session.scalars(select(RentalBackoff).where(RentalBackoff.until > now)):
        if b.queue in views:
            views[b.queue].backoffs.append(
                BackoffView(b.provider, b.failures, b.until, b.last_error)
            )
    for t in session.scalars(select(ManualTarget).where(ManualTarget.until > now)):
        if t.queue in views:
            views[t.queue].manual_target = TargetView(t.workers, t.until, t.set_by)
    return [views[n] for n in sorted(views)]


def events(
    session: Session,
    *,
    queue: str | None = None,
    launch_id: str | None = None,
    kinds: Sequence[str] = (),
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 50,
) -> list[EventView]:
    """The newest `limit` events that match, oldest first (one query)."""
    q = select(ScaleEvent)
    if queue is not None:
        q = q.where(ScaleEvent.queue == queue)
    if launch_id is not None:  # a launch id or a prefix of one (the tables show 12 chars)
        q = q.where(ScaleEvent.launch_id.startswith(launch_id, autoescape=True))
    if kinds:
        q = q.where(or_(ScaleEvent.kind.in_(list(kinds)), ScaleEvent.action.in_(list(kinds))))
    if since is not None:
        q = q.where(ScaleEvent.at >= since)
    if until is not None:
        q = q.where(ScaleEvent.at <= until)
    rows = list(
        session.scalars(q.order_by(ScaleEvent.at.desc(), ScaleEvent.id.desc()).limit(limit))
    )
    return [
        EventView(e.id, e.at, e.queue, e.kind, e.action, e.launch_id, e.reason, e.details)
        for e in reversed(rows)
    ]


def statuses(session: Session) -> dict[str, QueueStatus]:
    """Each queue's latest evaluation (its `queue_status` row), by queue. One query."""
    return {r.queue: r for r in session.scalars(select(QueueStatus))}


def instance_rows(
    session: Session,
    *,
    queue: str | None = None,
    state: InstanceState | None = None,
    limit: int = 200,
) -> list[Instance]:
    """The newest `limit` machine rows of any state, newest first (the admin API's list,
    which shows columns the views leave out). One query."""
    q = select(Instance).order_by(Instance.id.desc()).limit(limit)
    if queue is not None:
        q = q.where(Instance.queue == queue)
    if state is not None:
        q = q.where(Instance.state == state)
    return list(session.scalars(q))


def newest_events(
    session: Session,
    *,
    queue: str | None = None,
    kind: str | None = None,
    launch_id: str | None = None,
    since: datetime | None = None,
    limit: int = 100,
) -> list[EventView]:
    """The newest `limit` events that match exactly (a whole launch id, a kind), newest
    first: the admin API's filter, where `events` is the CLI's. One query."""
    q = select(ScaleEvent).order_by(ScaleEvent.id.desc()).limit(limit)
    if queue is not None:
        q = q.where(ScaleEvent.queue == queue)
    if kind is not None:
        q = q.where(ScaleEvent.kind == kind)
    if launch_id is not None:
        q = q.where(ScaleEvent.launch_id == launch_id)
    if since is not None:
        q = q.where(ScaleEvent.at >= since)
    return [
        EventView(e.id, e.at, e.queue, e.kind, e.action, e.launch_id, e.reason, e.details)
        for e in session.scalars(q)
    ]


def launch_counts(session: Session) -> dict[tuple[str, str], int]:
    """(queue, "created" | "failed") -> launches of the audit trail (queue "" for none)."""
    rows = session.execute(
        select(ScaleEvent.queue, ScaleEvent.action, func.count())
        .where(ScaleEvent.kind == "launch", ScaleEvent.action.in_(("created", "failed")))
        .group_by(ScaleEvent.queue, ScaleEvent.action)
    )
    return {(queue or "", action): n for queue, action, n in rows}


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


__all__ = [
    "EventView",
    "InstanceView",
    "QueueView",
    "Spend",
    "billing_interval",
    "events",
    "instance_rows",
    "instances",
    "launch_counts",
    "newest_events",
    "queues",
    "spend",
    "statuses",
]

"""Read-only operator views of the store: per queue, per machine, spend, the audit trail.

Shared by `autoscaler status / instances / events` and usable by the API's admin endpoints and
the dashboard. Nothing here writes (expired manual targets are skipped, not deleted), and each
view is a fixed number of queries whatever the number of queues or machines.

Money, by the one rule of `policy.billing`: a machine bills from the moment the provider created
it (its move to `booting`; a row still `pending` or `creating` has no machine yet) until it was
terminated, lost or failed (or now, if it may still bill), at its **real** price
(`instances.price_per_hour`: the price the provider reported for the machine, else the offer's),
never the queue's cap. A machine of unknown price adds nothing to a sum and is counted in
`unknown_price` instead. "Today" is the UTC day.

A warm pool's machine bills its running price until it is `stopped` (`stopping` and `resuming`
bill the full price), and while `stopped` only its storage price
(`instances.storage_price_per_hour`, 0 when unknown), until it left that state (resumed,
destroyed, lost) or now. Warm hits and misses (the `warm_pool` events) are counted over the same
UTC day.

What changed (issue 35): the bill is read from each machine's state history
(`instance_transitions`, `store/transitions.py`: one row per move), not from the row's one
timestamp per state. The row keeps the times of its latest stop only, so a machine stopped and
resumed twice used to be billed its full price for its earlier stops; every stop now counts at
the storage price, exactly. A row without a history of its own (written before the history
existed and not backfilled, or written directly) is billed from its columns as before. Every
other figure is as it was. One more query per view that bills (the histories of the machines
it read), still a fixed number.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from autoscaler.config.durations import parse_duration
from autoscaler.lifecycle import BOOTING_STATES, LEAVING_STATES, LIVE_STATES, InstanceState
from autoscaler.policy import billing
from autoscaler.store import config_versions, transitions
from autoscaler.store.boots import boot_tables
from autoscaler.store.events import HANDBACK_EVENT, PREEMPTION_EVENT, WARM_EVENT
from autoscaler.store.instances import InstanceDetails
from autoscaler.store.instances import details as instance_details
from autoscaler.store.models import (
    Instance,
    ManualTargetRow,
    MetricReading,
    ProviderRateLimit,
    QueueStatus,
    RentalBackoff,
    ScaleEvent,
)

S = InstanceState
_ON = frozenset(s.value for s in (S.READY, *BOOTING_STATES))
"""A queue's machines on a provider that `status` counts as that provider serving it."""


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
    rate_per_hour: float | None
    """What it bills per hour now: its storage price while stopped (0 when unknown), else its
    price (None when unknown)."""
    storage_price_per_hour: float | None
    """What it bills per hour while stopped (its kept disk), when known."""
    stopped_at: datetime | None
    """Stopped since (None unless it is stopped, or was when it was destroyed or lost)."""
    destroy_at: datetime | None
    """A stopped machine of a queue with a warm pool: when `keep_for` runs out and it is
    destroyed (its stop + the newest config's `keep_for`); else None."""
    resumes: int
    """How many times it was resumed from its queue's warm pool."""

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("last_heartbeat_at", "created_at", "stopped_at", "destroy_at"):
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
    cause: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "failures": self.failures,
            "until": self.until.isoformat(),
            "last_error": self.last_error,
            "cause": self.cause,
        }


PROVIDER_STATES = {
    "auth": "key refused",
    "no_offer": "no offer under the cap",
    "capacity": "out of capacity",
    "no_answer": "no answer",
    "error": "backoff",
    "boot": "backoff (a boot failed)",
}
"""What `status` calls a provider of a queue in backoff, by the backoff's cause."""


@dataclass(frozen=True)
class ProviderStateView:
    """One provider of a queue that lists several: serving (machines of the queue on it),
    open (none, and nothing holds it), rate limited or not answering (held for every queue),
    or in backoff with its cause."""

    provider: str
    state: str
    machines: int = 0
    until: datetime | None = None
    detail: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "state": self.state,
            "machines": self.machines,
            "until": self.until.isoformat() if self.until else None,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class TargetView:
    workers: int
    until: datetime
    set_by: str

    def as_json(self) -> dict[str, Any]:
        return {"workers": self.workers, "until": self.until.isoformat(), "set_by": self.set_by}


@dataclass(frozen=True)
class PoolConfig:
    """A queue's `autoscale.warm_pool` as the newest config says (size 0: no pool)."""

    size: int
    keep_for: float
    """Seconds a stopped machine is kept before it is destroyed."""


@dataclass
class WarmPoolView:
    """A queue's warm pool: its size in the newest config, its machines by warm state, what the
    stopped ones bill, and today's warm hits (resumed machines that became ready) and misses
    (resumes that failed: destroyed, a fresh machine rented)."""

    size: int = 0
    keep_for: float | None = None
    stopped: int = 0
    stopping: int = 0
    resuming: int = 0
    storage_per_hour: float = 0.0
    hits_today: int = 0
    misses_today: int = 0

    @property
    def shown(self) -> bool:
        """Worth a column: a pool is configured, or it has machines or warm events today."""
        return bool(
            self.size
            or self.stopped
            or self.stopping
            or self.resuming
            or self.hits_today
            or self.misses_today
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "keep_for_seconds": self.keep_for,
            "stopped": self.stopped,
            "stopping": self.stopping,
            "resuming": self.resuming,
            "storage_per_hour": round(self.storage_per_hour, 6),
            "hits_today": self.hits_today,
            "misses_today": self.misses_today,
        }


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
    warm_pool: WarmPoolView = field(default_factory=WarmPoolView)
    providers: list[ProviderStateView] = field(default_factory=list)
    """Each provider of a queue that lists several, in the order written (empty for one)."""
    preemptions_today: int = 0
    """Its interruptible machines stopped by their provider (outbid) since 00:00 UTC."""
    early_ack_losses_today: int = 0
    """Machines lost since 00:00 UTC while their workers said they ran early-acked jobs (gone
    with them: no broker keeps a record of such a job)."""
    requeued_today: int = 0
    """Lost machines since 00:00 UTC whose unacknowledged jobs their broker requeued at once
    (RabbitMQ: their user's connections closed)."""
    preempting_hosts: dict[str, int] = field(default_factory=dict)
    """Host -> its machines preempted since 00:00 UTC."""

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
            "warm_pool": self.warm_pool.as_json(),
            "providers": [p.as_json() for p in self.providers],
            "preemptions_today": self.preemptions_today,
            "early_ack_losses_today": self.early_ack_losses_today,
            "requeued_today": self.requeued_today,
            "preempting_hosts": dict(self.preempting_hosts),
        }


@dataclass(frozen=True)
class Spend:
    rate_per_hour: float
    """Σ real price of every machine that may still bill (a stopped one: its storage price)."""
    today: float
    """What every machine billed since 00:00 UTC today, up to now (stopped time at the storage
    price)."""
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


Histories = Mapping[str, Sequence[transitions.Transition]]
"""Launch id -> its moves (`transitions.history`)."""


def life(row: Instance, histories: Histories | None = None) -> list[billing.Interval[datetime]]:
    """The machine of `row` as the money rule reads it: its intervals (state, from, to), from
    its history in `histories`, or from its columns when it has none there."""
    return transitions.intervals(row, histories or {})


def current_rate(row: Instance) -> float | None:
    """What the machine of `row` bills per hour now (`billing.rate`): its storage price while
    stopped (0 when unknown), else its price (None when unknown). A row that bills nothing (no
    machine yet, or ended) shows its price, as it always did."""
    if billing.charge(row.state) is billing.Charge.NONE:
        return row.price_per_hour
    return billing.rate(row.state, row.price_per_hour, row.storage_price_per_hour)


def billed(
    row: Instance,
    now: datetime,
    since: datetime | None = None,
    histories: Histories | None = None,
) -> tuple[float, float | None]:
    """(Seconds billed, dollars billed) by the machine of `row` from `since` (or its create)
    to now (`billing.bill` over its `life`): its running time at its price, every stopped
    time at its storage price (0 when unknown). Dollars None when it ran for a price that is
    unknown."""
    bill = billing.bill(
        life(row, histories),
        row.price_per_hour,
        row.storage_price_per_hour,
        until=now,
        since=since,
    )
    return bill.seconds, bill.dollars


def day_start(now: datetime) -> datetime:
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


# ------------------------------------------------------------------------------ views


def _stopped_since(row: Instance) -> datetime | None:
    """When a machine stopped, while it is stopped or if it was destroyed or lost from there
    (not once resumed)."""
    at = row.stopped_at
    if at is None or row.state not in (S.STOPPED, S.TERMINATING, S.TERMINATED, S.LOST):
        return None
    resumed = row.resuming_at is not None and row.resuming_at >= at
    return None if resumed else at


def _pool_configs(document: dict[str, Any] | None) -> dict[str, PoolConfig]:
    """Queue -> its warm pool, for the queues of a config document that have one (size > 0)."""
    out: dict[str, PoolConfig] = {}
    for name, cfg in ((document or {}).get("queues") or {}).items():
        auto = cfg.get("autoscale") if isinstance(cfg, dict) else None
        pool = auto.get("warm_pool") if isinstance(auto, dict) else None
        size = _int(pool.get("size")) if isinstance(pool, dict) else None
        if not size or size < 0 or not isinstance(pool, dict):
            continue
        try:
            keep_for = parse_duration(pool.get("keep_for", 86400.0))
        except ValueError:
            continue
        if math.isfinite(keep_for) and keep_for > 0:
            out[str(name)] = PoolConfig(size, keep_for)
    return out


def warm_pools(session: Session) -> dict[str, PoolConfig]:
    """Queue -> its warm pool in the newest config (queues without one left out). One query."""
    latest = config_versions.latest(session)
    return _pool_configs(latest.document if latest else None)


def _instance_view(
    row: Instance, now: datetime, pools: Mapping[str, PoolConfig], histories: Histories
) -> InstanceView:
    seconds, dollars = billed(row, now, histories=histories)
    pool = pools.get(row.queue)
    destroy_at = (
        row.stopped_at + timedelta(seconds=pool.keep_for)
        if row.state == S.STOPPED and row.stopped_at is not None and pool is not None
        else None
    )
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
        billed_seconds=seconds,
        cost_so_far=dollars,
        last_heartbeat_at=row.last_heartbeat_at,
        created_at=row.created_at,
        rate_per_hour=current_rate(row),
        storage_price_per_hour=row.storage_price_per_hour,
        stopped_at=_stopped_since(row),
        destroy_at=destroy_at,
        resumes=row.resumes or 0,
    )


def instances(
    session: Session,
    now: datetime,
    *,
    queue: str | None = None,
    states: Collection[InstanceState] | None = None,
    include_closed: bool = False,
    limit: int = 500,
    pools: Mapping[str, PoolConfig] | None = None,
) -> list[InstanceView]:
    """Machines, oldest first: those that may still bill, or (`include_closed`) the newest
    `limit` of any state. Three queries (two with `pools`: the stopped machines' destroy
    times come from the newest config's warm pools, or these; one more for their histories)."""
    if pools is None:
        pools = warm_pools(session)
    q = select(Instance)
    if states:
        q = q.where(Instance.state.in_(list(states)))
    elif not include_closed:
        q = q.where(Instance.state.in_(LIVE_STATES))
    if queue is not None:
        q = q.where(Instance.queue == queue)
    rows = list(session.scalars(q.order_by(Instance.id.desc()).limit(limit)))
    histories = transitions.history(session, [r.launch_id for r in rows])
    return [_instance_view(r, now, pools, histories) for r in reversed(rows)]


def spend(session: Session, now: datetime) -> Spend:
    """Spend rate now and what was billed today (two queries: rows that may bill or billed
    today, and their histories)."""
    start = day_start(now)
    billing_today = or_(
        Instance.state.in_(LIVE_STATES),
        Instance.terminated_at >= start,
        Instance.lost_at >= start,
        Instance.failed_at >= start,
        Instance.updated_at >= start,
    )
    rows = list(session.scalars(select(Instance).where(billing_today)))
    histories = transitions.history(session, select(Instance.launch_id).where(billing_today))
    rate = today = 0.0
    unknown = 0
    for row in rows:
        live = row.state in LIVE_STATES and row.booting_at is not None
        now_rate = current_rate(row)
        if now_rate is None:
            unknown += 1 if live else 0
            continue
        if live:
            rate += now_rate
        _, dollars = billed(row, now, since=start, histories=histories)
        today += dollars or 0.0
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


def _listed_providers(document: dict[str, Any] | None) -> dict[str, list[str]]:
    """Config queue -> its providers, for the queues of a config document listing several."""
    out: dict[str, list[str]] = {}
    for name, cfg in ((document or {}).get("queues") or {}).items():
        auto = cfg.get("autoscale") if isinstance(cfg, dict) else None
        listed = auto.get("provider") if isinstance(auto, dict) else None
        if isinstance(listed, list) and len(listed) > 1:
            out[str(name)] = [str(p) for p in listed]
    return out


def _provider_states(
    session: Session,
    now: datetime,
    listed: dict[str, list[str]],
    backoffs: dict[tuple[str, str], RentalBackoff],
    rows: list[InstanceView],
) -> dict[str, list[ProviderStateView]]:
    """Each listed provider's state for its queue (`QueueView.providers`). One query."""
    if not listed:
        return {}
    limits = {
        r.provider: r
        for r in session.scalars(select(ProviderRateLimit).where(ProviderRateLimit.until > now))
    }
    out: dict[str, list[ProviderStateView]] = {}
    for queue, names in listed.items():
        states = []
        for name in names:
            on = sum(1 for m in rows if m.queue == queue and m.provider == name and m.state in _ON)
            limit, b = limits.get(name), backoffs.get((queue, name))
            if limit is not None:
                state = "no answer" if limit.cause == "unanswered" else "rate limited"
                states.append(ProviderStateView(name, state, on, limit.until, limit.reason))
            elif b is not None:
                state = PROVIDER_STATES.get(b.cause or "error", "backoff")
                states.append(ProviderStateView(name, state, on, b.until, b.last_error))
            else:
                states.append(ProviderStateView(name, "serving" if on else "open", on))
        out[queue] = states
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
    in force, the manual target and its warm pool (today's hits and misses). A fixed number of
    queries."""
    latest = config_versions.latest(session)
    document = latest.document if latest else None
    configured = _broker_queues(document)
    pools = _pool_configs(document)
    status = statuses(session)
    rows = list(machines) if machines is not None else instances(session, now, pools=pools)
    names = set(configured) | set(status) | {m.queue for m in rows}
    if only is not None:
        names &= {only}
    views = {n: QueueView(n, autoscaled=configured.get(n, (n, True))[1]) for n in names}
    for name, pool in pools.items():
        if name in views:
            views[name].warm_pool.size = pool.size
            views[name].warm_pool.keep_for = pool.keep_for
    for name, (preempted, lost, back) in lost_work(session, day_start(now)).items():
        if name in views:
            view = views[name]
            view.preemptions_today, view.early_ack_losses_today, view.requeued_today = (
                preempted,
                lost,
                back,
            )
    for (name, _, host), n in preempting_hosts(session, day_start(now)).items():
        if name in views:
            views[name].preempting_hosts[host] = n
    for (name, action), n in warm_counts(session, since=day_start(now)).items():
        if name in views and action in ("hit", "miss"):
            warm = views[name].warm_pool
            if action == "hit":
                warm.hits_today = n
            else:
                warm.misses_today = n

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
        warm = mview.warm_pool
        if state == S.STOPPED:
            warm.stopped += 1
            warm.storage_per_hour += m.rate_per_hour or 0.0
        elif state == S.STOPPING:
            warm.stopping += 1
        elif state == S.RESUMING:
            warm.resuming += 1
        if m.rate_per_hour is not None and m.billed_seconds > 0 and state in LIVE_STATES:
            mview.spend_per_hour += m.rate_per_hour

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

    backoffs = {
        (b.queue, b.provider): b
        for b in session.scalars(select(RentalBackoff).where(RentalBackoff.until > now))
    }
    for b in backoffs.values():
        if b.queue in views:
            views[b.queue].backoffs.append(
                BackoffView(b.provider, b.failures, b.until, b.last_error, b.cause)
            )
    listed = {q: names for q, names in _listed_providers(document).items() if q in views}
    for name, states in _provider_states(session, now, listed, backoffs, rows).items():
        views[name].providers = states
    for t in session.scalars(select(ManualTargetRow).where(ManualTargetRow.until > now)):
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
) -> list[InstanceDetails]:
    """The newest `limit` machine rows of any state, newest first, as frozen records (the admin
    API's list, which shows columns the views leave out). One query."""
    q = select(Instance).order_by(Instance.id.desc()).limit(limit)
    if queue is not None:
        q = q.where(Instance.queue == queue)
    if state is not None:
        q = q.where(Instance.state == state)
    return [instance_details(r) for r in session.scalars(q)]


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


def preempting_hosts(session: Session, since: datetime) -> dict[tuple[str, str, str], int]:
    """(queue, provider, host) -> our machines preempted there since `since` (the events)."""
    out: dict[tuple[str, str, str], int] = {}
    for queue, details in session.execute(
        select(ScaleEvent.queue, ScaleEvent.details).where(
            ScaleEvent.at >= since, ScaleEvent.kind == PREEMPTION_EVENT
        )
    ):
        info = details if isinstance(details, dict) else {}
        key = (queue or "", str(info.get("provider") or ""), str(info.get("host") or "?"))
        out[key] = out.get(key, 0) + 1
    return out


def lost_work(session: Session, since: datetime) -> dict[str, tuple[int, int, int]]:
    """Queue -> (machines preempted, machines lost while their workers said they ran early-acked
    jobs, machines whose jobs their broker requeued) since `since`, from the events (one query
    over the day's few hand-back and preemption events). Machines, not jobs: the ids a machine
    names are its word, and no broker keeps a record of an early-acked job."""
    out: dict[str, list[int]] = {}
    for queue, kind, action, details in session.execute(
        select(ScaleEvent.queue, ScaleEvent.kind, ScaleEvent.action, ScaleEvent.details).where(
            ScaleEvent.at >= since,
            ScaleEvent.kind.in_([PREEMPTION_EVENT, HANDBACK_EVENT]),
        )
    ):
        counts = out.setdefault(queue or "", [0, 0, 0])
        info = details if isinstance(details, dict) else {}
        if kind == PREEMPTION_EVENT:
            counts[0] += 1
        elif action == "lost":
            counts[1] += 1
        elif action == "requeued" and info.get("connections_closed"):
            counts[2] += 1
    return {q: (a, b, c) for q, (a, b, c) in out.items()}


def warm_counts(session: Session, since: datetime | None = None) -> dict[tuple[str, str], int]:
    """(queue, action) -> warm pool events (`events.WARM_EVENT`: stop, stopped, resume, hit,
    miss, destroy) since `since` (or ever), queue "" for none. One grouped query."""
    q = select(ScaleEvent.queue, ScaleEvent.action, func.count()).where(
        ScaleEvent.kind == WARM_EVENT
    )
    if since is not None:
        q = q.where(ScaleEvent.at >= since)
    rows = session.execute(q.group_by(ScaleEvent.queue, ScaleEvent.action))
    return {(queue or "", action): n for queue, action, n in rows}


@dataclass(frozen=True)
class BootTimeView:
    """Cold boots of one (provider, GPU) — of one queue where `queue` is set — over the last
    `boots.BOOT_STATS_WINDOW`: median and p90 seconds from the launch decision to ready (the
    control plane's own times) and how many boots. `gpu` is "" where it is unknown."""

    provider: str
    gpu: str
    median_seconds: float
    p90_seconds: float
    samples: int
    queue: str | None = None

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "provider": self.provider,
            "gpu": self.gpu,
            "median_seconds": round(self.median_seconds, 3),
            "p90_seconds": round(self.p90_seconds, 3),
            "samples": self.samples,
        }
        if self.queue is not None:
            data["queue"] = self.queue
        return data


def boot_times(session: Session, now: datetime, *, queue: str | None = None) -> list[BootTimeView]:
    """Boot times per (provider, GPU), or per (provider, GPU) for `queue`'s machines alone,
    sorted by provider and GPU (`boots.boot_stats`). One query."""
    by_key, by_queue = boot_tables(session, now)
    if queue is None:
        return [
            BootTimeView(p, g, st.median, st.p90, st.samples)
            for (p, g), st in sorted(by_key.items())
        ]
    return [
        BootTimeView(p, g, st.median, st.p90, st.samples, queue=q)
        for (q, p, g), st in sorted(by_queue.items())
        if q == queue
    ]


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


__all__ = [
    "BootTimeView",
    "EventView",
    "Histories",
    "InstanceView",
    "PoolConfig",
    "QueueView",
    "Spend",
    "WarmPoolView",
    "billed",
    "boot_times",
    "current_rate",
    "events",
    "instance_rows",
    "instances",
    "launch_counts",
    "life",
    "newest_events",
    "queues",
    "spend",
    "statuses",
    "warm_counts",
    "warm_pools",
]

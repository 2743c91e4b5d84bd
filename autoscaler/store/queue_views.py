"""Queues as the operator views read them (`autoscaler status`, the dashboard): per queue its
last good reading, its machines by kind, what the latest evaluation wants and why, backoffs in
force, its providers' states when it lists several, the manual target, its warm pool, and the
machines it lost today.

Shared by `autoscaler status` and the API's dashboard. Nothing here writes (expired manual
targets are skipped, not deleted), and the view is a fixed number of queries whatever the
number of queues or machines. Its sibling views: `store.machine_views` (per machine),
`store.spend` (money, by the one rule of `policy.billing`), `store.warm_pool_views`,
`store.event_views` (the audit trail), `store.boots.boot_times`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from autoscaler.lifecycle import BOOTING_STATES, LEAVING_STATES, LIVE_STATES, InstanceState
from autoscaler.store import config_versions, queue_status
from autoscaler.store.event_views import lost_work, preempting_hosts
from autoscaler.store.machine_views import InstanceView, instances
from autoscaler.store.models import (
    ManualTargetRow,
    MetricReading,
    ProviderRateLimit,
    RentalBackoff,
)
from autoscaler.store.spend import day_start
from autoscaler.store.warm_pool_views import WarmPoolView, pool_configs, warm_counts

S = InstanceState
_ON = frozenset(s.value for s in (S.READY, *BOOTING_STATES))
"""A queue's machines on a provider that `status` counts as that provider serving it."""


# ------------------------------------------------------------------------------ records


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


# ------------------------------------------------------------------------------ the view


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
    pools = pool_configs(document)
    status = queue_status.evaluations(session)
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


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


__all__ = [
    "PROVIDER_STATES",
    "BackoffView",
    "ProviderStateView",
    "QueueView",
    "TargetView",
    "queues",
]

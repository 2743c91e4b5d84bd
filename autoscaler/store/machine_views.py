"""Machines as the operator views read them (`autoscaler instances`, the machines of `status`,
the dashboard, the admin API's list): per machine its work, age and what it bills at its real
price (`store.spend`), and a warm pool's stopped machine since when and until when it is kept.
A fixed number of queries whatever the number of machines; nothing here writes."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from autoscaler.lifecycle import LIVE_STATES, InstanceState
from autoscaler.store import transitions
from autoscaler.store.instances import InstanceDetails
from autoscaler.store.instances import details as instance_details
from autoscaler.store.models import Instance
from autoscaler.store.spend import Histories, billed, current_rate
from autoscaler.store.warm_pool_views import PoolConfig, warm_pools

S = InstanceState


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


def _stopped_since(row: Instance) -> datetime | None:
    """When a machine stopped, while it is stopped or if it was destroyed or lost from there
    (not once resumed)."""
    at = row.stopped_at
    if at is None or row.state not in (S.STOPPED, S.TERMINATING, S.TERMINATED, S.LOST):
        return None
    resumed = row.resuming_at is not None and row.resuming_at >= at
    return None if resumed else at


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


__all__ = ["InstanceView", "instance_rows", "instances"]

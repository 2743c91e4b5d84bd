"""The machines' rows, read: frozen records (never ORM rows) of one row, of the live ones, and
what the loop, reconcile and the metrics side count from them.

Reads are batched (one query per table, whatever the number of queues or machines). Writes are
elsewhere: conditional moves and column writes in `store.moves`, intents in `store.intents`,
what machines report in `store.heartbeats`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from autoscaler.lifecycle import BOOTING_STATES, LIVE_STATES, InstanceState
from autoscaler.policy.billing import Charge, committed
from autoscaler.policy.reconcile import Row
from autoscaler.policy.snapshot import Billing, Machine
from autoscaler.store.models import Instance

STATE_SINCE = {
    InstanceState.PENDING: "pending_at",
    InstanceState.CREATING: "creating_at",
    InstanceState.BOOTING: "booting_at",
    InstanceState.READY: "ready_at",
    InstanceState.DRAINING: "draining_at",
    InstanceState.DRAINED: "drained_at",
    InstanceState.STOPPING: "stopping_at",
    InstanceState.STOPPED: "stopped_at",
    InstanceState.RESUMING: "resuming_at",
    InstanceState.TERMINATING: "terminating_at",
    InstanceState.TERMINATED: "terminated_at",
    InstanceState.FAILED: "failed_at",
    InstanceState.LOST: "lost_at",
}
"""The timestamp column each state sets when a row enters it."""


@dataclass(frozen=True)
class InstanceRecord:
    """The columns of an instance row the loop reads, as plain data (not an ORM object)."""

    launch_id: str
    queue: str
    provider: str
    state: InstanceState
    created_at: datetime
    since: datetime
    provider_instance_id: str | None
    host_id: str | None
    worker_name: str | None
    ready_at: datetime | None
    last_heartbeat_at: datetime | None
    last_task_at: datetime | None
    running_tasks: int
    drain_requested: bool
    price_per_hour: float | None
    agent_registered_at: datetime | None = None
    silence_noted_at: datetime | None = None
    spec_key: str | None = None
    keep_warm: bool = False
    stopped_at: datetime | None = None
    storage_price_per_hour: float | None = None
    interruptible: bool = False


@dataclass(frozen=True)
class InstanceDetails(InstanceRecord):
    """Every column of one instance row (`get`, the API's worker token), as plain data: what a
    lifecycle step or the API reads of one machine. Writing goes through the store's functions."""

    id: int = 0
    state_reason: str | None = None
    gpu: str | None = None
    offer: dict[str, Any] | None = None
    placement: dict[str, Any] | None = None
    decision_id: int | None = None
    config_version: int | None = None
    attempts: int = 0
    pending_at: datetime | None = None
    creating_at: datetime | None = None
    booting_at: datetime | None = None
    draining_at: datetime | None = None
    drained_at: datetime | None = None
    stopping_at: datetime | None = None
    resuming_at: datetime | None = None
    terminating_at: datetime | None = None
    terminated_at: datetime | None = None
    failed_at: datetime | None = None
    lost_at: datetime | None = None
    tasks: list[str] | None = None
    acks_late: bool | None = None
    handback_due_at: datetime | None = None
    handback_done_at: datetime | None = None
    gpu_utilisation: float | None = None
    worker_token_hash: str | None = None
    broker_user: str | None = None
    cancel_requested_at: datetime | None = None
    resumes: int = 0
    updated_at: datetime | None = None


_DETAILS = tuple(f.name for f in fields(InstanceDetails) if f.name != "since")


def details(row: Instance) -> InstanceDetails:
    """One ORM row as its frozen record (the ORM row stays in the store)."""
    values = {name: getattr(row, name) for name in _DETAILS}
    values["interruptible"] = bool(row.interruptible)
    since = getattr(row, STATE_SINCE[InstanceState(row.state)]) or row.created_at
    return InstanceDetails(since=since, **values)


def get(session: Session, launch_id: str) -> InstanceDetails | None:
    """One machine's row, every column, or None (one query)."""
    row = session.scalar(select(Instance).where(Instance.launch_id == launch_id))
    return details(row) if row is not None else None


def queue_of(session: Session, launch_id: str) -> str | None:
    """One machine's queue, or None (one light query)."""
    return session.scalar(select(Instance.queue).where(Instance.launch_id == launch_id))


_RECORD_COLUMNS = (
    Instance.launch_id,
    Instance.queue,
    Instance.provider,
    Instance.state,
    Instance.created_at,
    Instance.provider_instance_id,
    Instance.host_id,
    Instance.worker_name,
    Instance.ready_at,
    Instance.last_heartbeat_at,
    Instance.last_task_at,
    Instance.running_tasks,
    Instance.drain_requested,
    Instance.price_per_hour,
    Instance.agent_registered_at,
    Instance.silence_noted_at,
    Instance.spec_key,
    Instance.keep_warm,
    Instance.storage_price_per_hour,
    Instance.interruptible,
    Instance.stopped_at,
    # the one timestamp of the row's state, not all thirteen: reading 20,000 rows spent a third
    # of its time converting timestamps it did not use (`benchmarks/tick.py`)
    case(
        {state: getattr(Instance, column) for state, column in STATE_SINCE.items()},
        value=Instance.state,
    ).label("state_since"),
)


def _records(session: Session, where: Any) -> list[InstanceRecord]:
    out = []
    for r in session.execute(select(*_RECORD_COLUMNS).where(where).order_by(Instance.id)):
        state = r.state
        out.append(
            InstanceRecord(
                launch_id=r.launch_id,
                queue=r.queue,
                provider=r.provider,
                state=state,
                created_at=r.created_at,
                since=r.state_since or r.created_at,
                provider_instance_id=r.provider_instance_id,
                host_id=r.host_id,
                worker_name=r.worker_name,
                ready_at=r.ready_at,
                last_heartbeat_at=r.last_heartbeat_at,
                last_task_at=r.last_task_at,
                running_tasks=r.running_tasks,
                drain_requested=r.drain_requested,
                price_per_hour=r.price_per_hour,
                agent_registered_at=r.agent_registered_at,
                silence_noted_at=r.silence_noted_at,
                spec_key=r.spec_key,
                keep_warm=r.keep_warm,
                stopped_at=r.stopped_at,
                storage_price_per_hour=r.storage_price_per_hour,
                interruptible=bool(r.interruptible),
            )
        )
    return out


def live_rows(session: Session, queues: Collection[str] | None = None) -> list[InstanceRecord]:
    """Every row that may still bill (one query, only the columns the loop reads); only those
    of `queues` where given (one shard's)."""
    live = Instance.state.in_(LIVE_STATES)
    return _records(session, live if queues is None else live & Instance.queue.in_(list(queues)))


def states_since(session: Session) -> dict[str, tuple[InstanceState, datetime]]:
    """Each live row's state and when it entered it (one light query): read before the
    providers are listed, it tells reconcile which rows moved while they were (`policy.reconcile`,
    "a listing is evidence only about what existed before it")."""
    since = _RECORD_COLUMNS[-1]
    rows = session.execute(
        select(Instance.launch_id, Instance.state, Instance.created_at, since).where(
            Instance.state.in_(LIVE_STATES)
        )
    )
    return {r.launch_id: (InstanceState(r.state), r.state_since or r.created_at) for r in rows}


def billing_elsewhere(session: Session, queues: Collection[str]) -> tuple[Billing, ...]:
    """What the live machines of every queue *not* in `queues` bill, per (queue, state): the
    other shards' part of the account-wide caps, counted in the database (one query, a row per
    queue and state instead of one per machine)."""
    rows = session.execute(
        select(
            Instance.queue,
            Instance.state,
            func.count(),
            func.coalesce(func.sum(Instance.price_per_hour), 0.0),
            func.count(Instance.price_per_hour),
            func.coalesce(func.sum(Instance.storage_price_per_hour), 0.0),
        )
        .where(Instance.state.in_(LIVE_STATES), Instance.queue.not_in(list(queues)))
        .group_by(Instance.queue, Instance.state)
        .order_by(Instance.queue, Instance.state)  # two counts of the same rows compare equal
    )
    out = []
    for queue, state, n, priced, n_priced, storage in rows:
        stopped = committed(InstanceState(state)) is Charge.STORAGE  # its disk only
        out.append(
            Billing(
                queue,
                InstanceState(state),
                n,
                float((storage if stopped else priced) or 0.0),
                0 if stopped else n - n_priced,
            )
        )
    return tuple(out)


def rows_of(session: Session, launch_ids: Collection[str]) -> list[InstanceRecord]:
    """The rows of these launches, whatever their state (one query)."""
    return _records(session, Instance.launch_id.in_(list(launch_ids))) if launch_ids else []


def as_machine(row: InstanceRecord) -> Machine:
    return Machine(
        launch_id=row.launch_id,
        state=row.state,
        created_at=row.created_at,
        provider=row.provider,
        ready_at=row.ready_at,
        running_tasks=row.running_tasks,
        last_task_at=row.last_task_at,
        drain_requested=row.drain_requested,
        price_per_hour=row.price_per_hour,
        spec_key=row.spec_key,
        keep_warm=row.keep_warm,
        stopped_at=row.stopped_at,
        storage_price_per_hour=row.storage_price_per_hour,
        interruptible=row.interruptible,
    )


def as_row(row: InstanceRecord) -> Row:
    return Row(
        launch_id=row.launch_id,
        queue=row.queue,
        provider=row.provider,
        state=row.state,
        since=row.since,
        provider_instance_id=row.provider_instance_id,
        host_id=row.host_id,
        last_seen_at=row.last_heartbeat_at,
        running_tasks=row.running_tasks,
        remote_control=row.agent_registered_at is None
        and bool(row.worker_name)
        and not (row.worker_name or "").startswith("agent@"),
        silence_noted_at=row.silence_noted_at,
        keep_warm=row.keep_warm,
        spec_key=row.spec_key,
        ready_at=row.ready_at,
    )


def machines_by_queue(rows: Iterable[InstanceRecord]) -> dict[str, tuple[Machine, ...]]:
    out: dict[str, list[Machine]] = defaultdict(list)
    for row in rows:
        out[row.queue].append(as_machine(row))
    return {q: tuple(ms) for q, ms in out.items()}


ON_THE_WAY = (*BOOTING_STATES, InstanceState.READY)
"""States of a machine that serves its queue or will (a draining one is leaving it; a stopped
one of a warm pool serves nothing: the fast path resumes it as it would rent)."""


def queues_served(session: Session) -> set[str]:
    """Queues with a machine serving or on its way (one query: the fast path's every second)."""
    return set(
        session.scalars(
            select(Instance.queue)
            .where(Instance.state.in_(ON_THE_WAY))
            .group_by(Instance.queue)
            .having(func.count() > 0)
        )
    )

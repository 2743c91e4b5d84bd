"""The control loop's reads and writes of machines, backoffs, manual targets and events.

Reads are batched (one query per table, whatever the number of queues or machines) and hand
out the decision core's frozen records, never ORM rows. Every state change is a conditional
write on the row's current state (`move`), so two processes acting on one machine cannot both
win, and a redelivered task finds nothing left to do.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import case, delete, func, insert, or_, select, update
from sqlalchemy.orm import Session

from autoscaler.config.models import Backoff
from autoscaler.lifecycle import BOOTING_STATES, LIVE_STATES, InstanceState, can_move
from autoscaler.policy.backoff import after_failure
from autoscaler.policy.reconcile import Row
from autoscaler.policy.snapshot import BackoffState, Machine, ManualTarget
from autoscaler.store.models import Instance, RentalBackoff, ScaleEvent
from autoscaler.store.models import ManualTarget as ManualTargetRow

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


# --------------------------------------------------------------------------- reads


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
    *(getattr(Instance, column) for column in dict.fromkeys(STATE_SINCE.values())),
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
                since=getattr(r, STATE_SINCE[state]) or r.created_at,
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
            )
        )
    return out


def live_rows(session: Session) -> list[InstanceRecord]:
    """Every row that may still bill (one query, only the columns the loop reads)."""
    return _records(session, Instance.state.in_(LIVE_STATES))


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
    )


def machines_by_queue(rows: Iterable[InstanceRecord]) -> dict[str, tuple[Machine, ...]]:
    out: dict[str, list[Machine]] = defaultdict(list)
    for row in rows:
        out[row.queue].append(as_machine(row))
    return {q: tuple(ms) for q, ms in out.items()}


def backoffs(session: Session) -> dict[str, tuple[BackoffState, ...]]:
    out: dict[str, list[BackoffState]] = defaultdict(list)
    for b in session.scalars(select(RentalBackoff)):
        out[b.queue].append(BackoffState(b.provider, b.failures, b.until, b.last_error))
    return {q: tuple(bs) for q, bs in out.items()}


def manual_targets(session: Session, now: datetime) -> dict[str, ManualTarget]:
    """Targets still in force; expired ones are deleted on the way."""
    session.execute(delete(ManualTargetRow).where(ManualTargetRow.until <= now))
    return {
        t.queue: ManualTarget(t.workers, t.until, t.set_by)
        for t in session.scalars(select(ManualTargetRow))
    }


def get(session: Session, launch_id: str) -> Instance | None:
    return session.scalar(select(Instance).where(Instance.launch_id == launch_id))


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


BOOT_HISTORY = 5
"""The boot time of a queue is the longest of its last this many boots (ready in time)."""


def boot_estimates(session: Session, queues: list[str], now: datetime) -> dict[str, float]:
    """Seconds from decision (the intent row) to ready of each queue's recent machines (one
    query over the last 30 days' cold boots: a machine resumed from a warm pool was ready long
    after its intent, which would read as a boot of hours and stop the burst rule renting)."""
    if not queues:
        return {}
    got: dict[str, list[float]] = {}
    for queue, created, ready in session.execute(
        select(Instance.queue, Instance.created_at, Instance.ready_at)
        .where(
            Instance.queue.in_(queues),
            Instance.ready_at.is_not(None),
            Instance.ready_at >= now - timedelta(days=30),
            Instance.resumes == 0,
        )
        .order_by(Instance.ready_at.desc())
        .limit(BOOT_HISTORY * len(queues) * 4)
    ).all():
        seen = got.setdefault(queue, [])
        if len(seen) < BOOT_HISTORY and ready is not None and ready >= created:
            seen.append((ready - created).total_seconds())
    return {q: max(v) for q, v in got.items() if v}


# --------------------------------------------------------------------------- writes


class Intent(NamedTuple):
    """One launch intent of an evaluation."""

    launch_id: str
    queue: str
    provider: str
    reason: str
    spec_key: str | None = None
    """What decide() rents it as (`policy.warm.spec_key`): a warm pool resumes only its like."""


def add_intents(
    session: Session,
    intents: Sequence[Intent | tuple[str, str, str, str]],
    now: datetime,
    config_version: int | None = None,
) -> None:
    """Launch intents of one evaluation of `config_version`: rows written before any create
    (`link_decisions` then ties each to its launch event)."""
    if not intents:
        return
    session.execute(
        insert(Instance),
        [
            {
                "launch_id": launch_id,
                "queue": queue,
                "provider": provider,
                "state": InstanceState.PENDING,
                "state_reason": reason[:2000],
                "pending_at": now,
                "created_at": now,
                "updated_at": now,
                "attempts": 0,
                "drain_requested": False,
                "running_tasks": 0,
                "config_version": config_version,
                "spec_key": key,
                "keep_warm": False,
                "resumes": 0,
            }
            for launch_id, queue, provider, reason, key in (Intent(*i) for i in intents)
        ],
    )


def link_decisions(session: Session, launch_ids: Sequence[str]) -> None:
    """Tie each new intent to the `launch` event its decision wrote (one statement)."""
    if not launch_ids:
        return
    event = (
        select(func.max(ScaleEvent.id))
        .where(
            ScaleEvent.launch_id == Instance.launch_id,
            ScaleEvent.kind == "scale_up",
            ScaleEvent.action == "launch",
        )
        .scalar_subquery()
    )
    session.execute(
        update(Instance)
        .where(Instance.launch_id.in_(list(launch_ids)))
        .values(decision_id=event)
        .execution_options(synchronize_session=False)
    )


def move(
    session: Session,
    launch_id: str,
    src: InstanceState | Sequence[InstanceState],
    dst: InstanceState,
    now: datetime,
    reason: str,
    *,
    only_if: Any = None,
    **fields: Any,
) -> bool:
    """Move a row from `src` (one state or several) to `dst` if it is still there; True if moved.

    The write is conditional on the current state (and on `only_if`, a further SQL condition
    on the row), so of two processes making the same move exactly one succeeds. Only the
    lifecycle's allowed transitions are accepted.
    """
    sources = (src,) if isinstance(src, InstanceState) else tuple(src)
    for s in sources:
        if not can_move(s, dst):
            raise ValueError(f"{s} -> {dst} is not an allowed transition")
    values = {"state": dst, STATE_SINCE[dst]: now, "state_reason": reason[:2000], "updated_at": now}
    values.update(fields)
    where = [Instance.launch_id == launch_id, Instance.state.in_(sources)]
    if only_if is not None:
        where.append(only_if)
    result = session.execute(
        update(Instance).where(*where).values(**values).execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0))


def claim_intent(session: Session, launch_id: str, now: datetime, token_hash: str) -> bool:
    """pending -> creating for the one launch task that gets there first (one more attempt, the
    machine's worker token hash recorded); True if this call claimed it."""
    return move(
        session,
        launch_id,
        InstanceState.PENDING,
        InstanceState.CREATING,
        now,
        "creating",
        attempts=Instance.attempts + 1,
        worker_token_hash=token_hash,
    )


READY_EVENT = ("lifecycle", "booting->ready")
"""(kind, action) of the event every path that sees a machine ready records."""


def mark_ready(
    session: Session, launch_id: str, queue: str, provider: str, now: datetime, why: str
) -> bool:
    """booting (or resuming from a warm pool) -> ready at the first proof of life of the
    machine's worker, wherever it is seen (its agent's heartbeat, Celery remote control,
    reconcile): one conditional write, one event, and the rental counts as good (the (queue,
    provider) backoff is cleared). True if this call made the move (of two racing callers, one
    does). A resumed machine's event is a warm hit."""
    if move(session, launch_id, InstanceState.BOOTING, InstanceState.READY, now, why):
        kind, action = READY_EVENT
        record_events(session, [event(kind, action, why, queue=queue, launch_id=launch_id)], now)
        clear_backoff(session, queue, provider)
        return True
    if move(session, launch_id, InstanceState.RESUMING, InstanceState.READY, now, why):
        record_events(session, [warm_event("hit", why, queue, launch_id)], now)
        return True
    return False


WARM_EVENT = "warm_pool"
"""The events' kind for a warm pool's stops, resumes, hits and misses (`status` counts them)."""


def warm_event(action: str, why: str, queue: str, launch_id: str, **details: Any) -> dict[str, Any]:
    """A warm pool's event: `stop`, `stopped`, `resume`, `hit` or `miss`."""
    return event(WARM_EVENT, action, why, queue=queue, launch_id=launch_id, details=details or None)


KEPT_WARM = Instance.keep_warm.is_(True)
"""`move(..., only_if=KEPT_WARM)`: only a machine with a place in its queue's warm pool."""


def start_resumes(session: Session, reasons: Mapping[str, str], now: datetime) -> list[str]:
    """stopped -> resuming for each launch id (with its reason), counted; its last signs of life
    forgotten, so only a word from the resumed worker makes it ready. The moved ids."""
    return move_many(
        session,
        reasons,
        InstanceState.STOPPED,
        InstanceState.RESUMING,
        now,
        resumes=Instance.resumes + 1,
        keep_warm=False,
        last_heartbeat_at=None,
        last_task_at=None,  # idle since it is ready again, not since before its stop
        running_tasks=0,
        silence_noted_at=None,
    )


def set_keep_warm(session: Session, launch_ids: Sequence[str], value: bool) -> None:
    """Give machines (or take back) a place in their queue's warm pool, as `decide()` said."""
    if launch_ids:
        session.execute(
            update(Instance)
            .where(Instance.launch_id.in_(launch_ids))
            .values(keep_warm=value)
            .execution_options(synchronize_session=False)
        )


CANCELLED = "cancelled before it was ready"


def request_cancel(session: Session, launch_id: str, now: datetime) -> bool:
    """Mark a `creating` row (its create in flight) to be destroyed as soon as it exists; True
    if the row was still creating (else the caller reads it again and acts on its new state)."""
    result = session.execute(
        update(Instance)
        .where(Instance.launch_id == launch_id, Instance.state == InstanceState.CREATING)
        .values(cancel_requested_at=now, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0))


def cancel_if_requested(session: Session, launch_id: str, now: datetime) -> bool:
    """booting -> terminating for a machine cancelled while its create was in flight (called
    in the same transaction as the move to booting, so no heartbeat can come between). True if
    it moved: the caller enqueues the destroy."""
    queue = session.scalar(select(Instance.queue).where(Instance.launch_id == launch_id))
    why = f"{CANCELLED}: its create returned after an operator drained it; destroyed now"
    moved = move(
        session,
        launch_id,
        InstanceState.BOOTING,
        InstanceState.TERMINATING,
        now,
        why,
        only_if=Instance.cancel_requested_at.is_not(None),
    )
    if moved:
        record_events(
            session, [event("drain", "cancelled", why, queue=queue, launch_id=launch_id)], now
        )
    return moved


def note_retry(session: Session, launch_id: str, step: str, reason: str) -> bool:
    """Mark a row's step as being retried; True the first time since its state last changed
    (so the retry is audited once, not on every reconcile)."""
    mark = f"retrying {step}: "
    result = session.execute(
        update(Instance)
        .where(
            Instance.launch_id == launch_id,
            or_(Instance.state_reason.is_(None), ~Instance.state_reason.startswith(mark)),
        )
        .values(state_reason=(mark + reason)[:2000])
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0))


def note_silence(session: Session, launch_ids: Collection[str], now: datetime) -> None:
    """A reconcile round found these machines silent past their limit (the first of two)."""
    if launch_ids:
        session.execute(
            update(Instance)
            .where(Instance.launch_id.in_(list(launch_ids)))
            .values(silence_noted_at=now)
            .execution_options(synchronize_session=False)
        )


SEEN_STATES = (
    InstanceState.BOOTING,
    InstanceState.RESUMING,
    InstanceState.READY,
    InstanceState.DRAINING,
)
"""States in which a machine's worker may answer remote control."""


def heard_through_broker(
    session: Session, launch_ids: Collection[str]
) -> list[tuple[str, int, InstanceState, str, str]]:
    """(launch_id, running_tasks, state, queue, provider) of these machines whose worker's
    broker replies may move their row: up (`SEEN_STATES`) and with no agent registered (a
    machine whose agent heartbeats is known from its authenticated heartbeats alone)."""
    if not launch_ids:
        return []
    return [
        (r[0], r[1], r[2], r[3], r[4])
        for r in session.execute(
            select(
                Instance.launch_id,
                Instance.running_tasks,
                Instance.state,
                Instance.queue,
                Instance.provider,
            ).where(
                Instance.launch_id.in_(list(launch_ids)),
                Instance.state.in_(SEEN_STATES),
                Instance.agent_registered_at.is_(None),
            )
        )
    ]


def note_worker(
    session: Session, launch_id: str, worker_name: str, running: int, now: datetime, busy: bool
) -> None:
    """What a machine's worker just said through the broker: its name, its running tasks and
    (when `busy`: a task ran since the last look) the time of its last task."""
    values: dict[str, object] = {
        "worker_name": worker_name,
        "last_heartbeat_at": now,
        "running_tasks": running,
    }
    if busy:
        values["last_task_at"] = now
    session.execute(
        update(Instance)
        .where(Instance.launch_id == launch_id)
        .values(**values)
        .execution_options(synchronize_session=False)
    )


def set_broker_user(session: Session, launch_id: str, user: str | None) -> None:
    """The per-machine broker user made for this launch (None: deleted), for terminate."""
    session.execute(
        update(Instance)
        .where(Instance.launch_id == launch_id)
        .values(broker_user=user)
        .execution_options(synchronize_session=False)
    )


def note_busy(session: Session, launch_id: str, running: int, now: datetime) -> None:
    """What a worker just said about its tasks (the drain step asks it directly)."""
    session.execute(
        update(Instance)
        .where(Instance.launch_id == launch_id)
        .values(running_tasks=running, last_task_at=now, last_heartbeat_at=now)
        .execution_options(synchronize_session=False)
    )


def note_registered(session: Session, launch_id: str, worker_name: str, now: datetime) -> None:
    """Its agent registered, naming its worker. Not yet a sign of the worker's life: the agent
    deploys first, and the machine is ready only at the heartbeat that says its worker starts
    (booting is judged by the boot timeout meanwhile)."""
    session.execute(
        update(Instance)
        .where(Instance.launch_id == launch_id)
        .values(worker_name=worker_name, agent_registered_at=now)
        .execution_options(synchronize_session=False)
    )


HEARTBEAT_COLUMNS = frozenset(
    {"last_heartbeat_at", "running_tasks", "gpu_utilisation", "last_task_at", "worker_name"}
)


def note_heartbeat(session: Session, launch_id: str, values: Mapping[str, Any]) -> None:
    """What its agent's heartbeat said (some of HEARTBEAT_COLUMNS; the API decides which)."""
    unknown = set(values) - HEARTBEAT_COLUMNS
    if unknown:
        raise ValueError(f"not a heartbeat column: {', '.join(sorted(unknown))}")
    session.execute(
        update(Instance)
        .where(Instance.launch_id == launch_id)
        .values(**values)
        .execution_options(synchronize_session=False)
    )


def move_many(
    session: Session,
    reasons: Mapping[str, str],
    src: InstanceState,
    dst: InstanceState,
    now: datetime,
    **fields: Any,
) -> list[str]:
    """`move` for many rows in one statement: each launch id with its own reason. Returns the
    launch ids that were still in `src` and moved."""
    if not reasons:
        return []
    if not can_move(src, dst):
        raise ValueError(f"{src} -> {dst} is not an allowed transition")
    values = {
        "state": dst,
        STATE_SINCE[dst]: now,
        "state_reason": case({k: v[:2000] for k, v in reasons.items()}, value=Instance.launch_id),
        "updated_at": now,
        **fields,
    }
    result = session.execute(
        update(Instance)
        .where(Instance.launch_id.in_(list(reasons)), Instance.state == src)
        .values(**values)
        .returning(Instance.launch_id)
        .execution_options(synchronize_session=False)
    )
    return [r[0] for r in result]


def set_drain_requested(session: Session, launch_ids: Sequence[str], value: bool) -> None:
    if launch_ids:
        session.execute(
            update(Instance)
            .where(Instance.launch_id.in_(launch_ids), Instance.state == InstanceState.READY)
            .values(drain_requested=value)
            .execution_options(synchronize_session=False)
        )


def record_rental_failure(
    session: Session, queue: str, provider: str, now: datetime, config: Backoff, error: str
) -> BackoffState:
    """One more failure of (queue, provider): the backoff grows (and survives restarts)."""
    row = session.get(RentalBackoff, (queue, provider), with_for_update=True)
    previous = BackoffState(provider, row.failures, row.until, row.last_error) if row else None
    state = after_failure(previous, queue, provider, now, config, error[:2000])
    if row is None:
        session.add(
            RentalBackoff(
                queue=queue,
                provider=provider,
                failures=state.failures,
                until=state.until,
                last_error=state.last_error,
            )
        )
    else:
        row.failures, row.until, row.last_error = state.failures, state.until, state.last_error
    session.flush()
    return state


def clear_backoff(session: Session, queue: str, provider: str) -> None:
    session.execute(
        delete(RentalBackoff).where(
            RentalBackoff.queue == queue, RentalBackoff.provider == provider
        )
    )


def set_manual_target(
    session: Session, queue: str, workers: int, until: datetime, by: str, now: datetime
) -> None:
    row = session.get(ManualTargetRow, queue)
    if row is None:
        session.add(
            ManualTargetRow(queue=queue, workers=workers, until=until, set_by=by, set_at=now)
        )
    else:
        row.workers, row.until, row.set_by, row.set_at = workers, until, by, now
    session.flush()


def clear_manual_target(session: Session, queue: str) -> bool:
    result = session.execute(delete(ManualTargetRow).where(ManualTargetRow.queue == queue))
    return bool(getattr(result, "rowcount", 0))


def record_events(session: Session, events: Sequence[Mapping[str, Any]], now: datetime) -> None:
    """Audit trail rows: queue, kind, action, launch_id, reason, details (one statement)."""
    if not events:
        return
    session.execute(
        insert(ScaleEvent),
        [
            {
                "at": now,
                "queue": e.get("queue"),
                "kind": e["kind"],
                "action": e["action"],
                "launch_id": e.get("launch_id"),
                "reason": str(e["reason"])[:4000],
                "details": e.get("details"),
            }
            for e in events
        ],
    )


def event(
    kind: str,
    action: str,
    reason: str,
    *,
    queue: str | None = None,
    launch_id: str | None = None,
    details: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "kind": kind,
        "action": action,
        "reason": reason,
        "queue": queue,
        "launch_id": launch_id,
        "details": dict(details) if details is not None else None,
    }

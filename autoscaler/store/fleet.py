"""The control loop's reads and writes of machines, backoffs, manual targets and events.

Reads are batched (one query per table, whatever the number of queues or machines) and hand
out the decision core's frozen records, never ORM rows. Every state change is a conditional
write on the row's current state (`move`), so two processes acting on one machine cannot both
win, and a redelivered task finds nothing left to do.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import case, delete, func, insert, or_, select, update
from sqlalchemy.orm import Session

from autoscaler.config import gpus
from autoscaler.config.models import Backoff
from autoscaler.lifecycle import BOOTING_STATES, LIVE_STATES, InstanceState, can_move
from autoscaler.policy.backoff import after_failure
from autoscaler.policy.boots import BootStat, boot_stat, judge_boot
from autoscaler.policy.reconcile import Row
from autoscaler.policy.snapshot import (
    BACKOFF_CAUSES,
    BackoffCause,
    BackoffState,
    Billing,
    Machine,
    ManualTarget,
)
from autoscaler.policy.triggers import DEFAULT_BOOT_ESTIMATE
from autoscaler.store.db import keyed_values
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
    interruptible: bool = False


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


def moves(session: Session) -> dict[str, tuple[InstanceState, datetime]]:
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
        stopped = state == InstanceState.STOPPED
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


def backoffs(session: Session) -> dict[str, tuple[BackoffState, ...]]:
    out: dict[str, list[BackoffState]] = defaultdict(list)
    for b in session.scalars(select(RentalBackoff)):
        out[b.queue].append(
            BackoffState(b.provider, b.failures, b.until, b.last_error, _cause(b.cause))
        )
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

BOOT_STATS_WINDOW = timedelta(days=7)
"""Boot statistics (`boot_stats`, the slow-host rule) count cold boots ready this recently."""

BOOT_STATS_SAMPLES = 50
"""… and at most this many of the newest per key."""

_BOOT_KEYS = {"queue": Instance.queue, "provider": Instance.provider, "gpu": Instance.gpu}


class ColdBoot(NamedTuple):
    """One cold boot: seconds from the decision (the intent row's `created_at`) to ready
    (`ready_at`), both on the store's clock, and its rank among the newest of each key."""

    launch_id: str
    queue: str
    provider: str
    gpu: str | None
    host_id: str | None
    seconds: float
    ranks: tuple[int, ...]


def cold_boots(
    session: Session,
    since: datetime,
    *,
    per: Sequence[Sequence[str]],
    latest: int,
    where: Sequence[Any] = (),
) -> list[ColdBoot]:
    """Cold boots (`resumes == 0`: a resumed machine is ready hours after its intent) ready
    since `since`, newest first: those among the `latest` newest of their key for any key of
    `per` (column names of `queue`, `provider`, `gpu`), `where` further SQL conditions. One
    query (a window function per key, on PostgreSQL and SQLite alike). Control-plane times
    only: what a machine reports never enters here."""
    ranks = [
        func.row_number()
        .over(
            partition_by=[_BOOT_KEYS[c] for c in key],
            order_by=(Instance.ready_at.desc(), Instance.id.desc()),
        )
        .label(f"rank{i}")
        for i, key in enumerate(per)
    ]
    found = (
        select(
            Instance.launch_id,
            Instance.queue,
            Instance.provider,
            Instance.gpu,
            Instance.host_id,
            Instance.created_at,
            Instance.ready_at,
            *ranks,
        )
        .where(
            Instance.ready_at.is_not(None),
            Instance.ready_at >= since,
            Instance.ready_at >= Instance.created_at,
            Instance.resumes == 0,
            *where,
        )
        .subquery()
    )
    kept = or_(*(found.c[f"rank{i}"] <= latest for i in range(len(per))))
    out = []
    for r in session.execute(select(found).where(kept).order_by(found.c.ready_at.desc())):
        out.append(
            ColdBoot(
                r.launch_id,
                r.queue,
                r.provider,
                r.gpu,
                r.host_id,
                max(0.0, (r.ready_at - r.created_at).total_seconds()),
                tuple(int(getattr(r, f"rank{i}")) for i in range(len(per))),
            )
        )
    return out


def boot_estimates(session: Session, queues: list[str], now: datetime) -> dict[str, float]:
    """Seconds from decision (the intent row) to ready of each queue's machines, for the
    (provider, GPU) it rents from now — its newest cold boot's: with placement across providers
    a queue may move to a provider whose machines boot in a third of the time — the longest of
    its last BOOT_HISTORY cold boots there, else over all its boots (the last 30 days). One
    query; cold boots only (a machine resumed from a warm pool was ready long after its
    intent, which would read as a boot of hours and stop the burst rule renting)."""
    if not queues:
        return {}
    everywhere: dict[str, list[float]] = {}
    per_pair: dict[tuple[str, str, str | None], list[float]] = {}
    newest: dict[str, tuple[str, str | None]] = {}
    for b in cold_boots(  # newest first
        session,
        now - timedelta(days=30),
        per=[("queue",), ("queue", "provider", "gpu")],
        latest=BOOT_HISTORY,
        where=[Instance.queue.in_(queues)],
    ):
        newest.setdefault(b.queue, (b.provider, b.gpu))
        if b.ranks[0] <= BOOT_HISTORY:
            everywhere.setdefault(b.queue, []).append(b.seconds)
        if b.ranks[1] <= BOOT_HISTORY:
            per_pair.setdefault((b.queue, b.provider, b.gpu), []).append(b.seconds)
    out = {}
    for queue, seconds in everywhere.items():
        here = per_pair.get((queue, *newest[queue]))
        out[queue] = max(here or seconds)
    return out


def _stats(
    boots: Iterable[ColdBoot], i: int, key: Callable[[ColdBoot], Any]
) -> dict[Any, BootStat]:
    seconds: dict[Any, list[float]] = defaultdict(list)
    for b in boots:
        if b.ranks[i] <= BOOT_STATS_SAMPLES:
            seconds[key(b)].append(b.seconds)
    return {k: stat for k, v in seconds.items() if (stat := boot_stat(v)) is not None}


def boot_tables(
    session: Session, now: datetime
) -> tuple[dict[tuple[str, str], BootStat], dict[tuple[str, str, str], BootStat]]:
    """`boot_stats` and `boot_stats_by_queue` from one query."""
    boots = cold_boots(
        session,
        now - BOOT_STATS_WINDOW,
        per=[("provider", "gpu"), ("queue", "provider", "gpu")],
        latest=BOOT_STATS_SAMPLES,
    )
    return (
        _stats(boots, 0, lambda b: (b.provider, b.gpu or "")),
        _stats(boots, 1, lambda b: (b.queue, b.provider, b.gpu or "")),
    )


def boot_stats(session: Session, now: datetime) -> dict[tuple[str, str], BootStat]:
    """Per (provider, GPU) — "" for a machine whose GPU is unknown — the median and p90
    seconds from decision to ready of its cold boots of the last BOOT_STATS_WINDOW (at most
    the newest BOOT_STATS_SAMPLES), and how many. Control-plane times only. One query."""
    return boot_tables(session, now)[0]


def boot_stats_by_queue(session: Session, now: datetime) -> dict[tuple[str, str, str], BootStat]:
    """`boot_stats` per (queue, provider, GPU). One query."""
    return boot_tables(session, now)[1]


def placement_boot_times(
    session: Session, queue: str, now: datetime
) -> tuple[dict[tuple[str, str], float], float]:
    """What a launch of `queue` ranks offers by (`policy.placement`): the median cold boot per
    (provider, GPU by its table name) — the queue's own boots where it has some, else every
    queue's — and the fallback for a pair never booted (the queue's boot estimate, else the
    default). Control-plane times only."""
    overall, by_queue = boot_tables(session, now)
    times = {(p, gpus.canonical(g)): b.median for (p, g), b in overall.items()}
    times.update(
        {(p, gpus.canonical(g)): b.median for (q, p, g), b in by_queue.items() if q == queue}
    )
    estimate = boot_estimates(session, [queue], now).get(queue)
    return times, estimate if estimate is not None else DEFAULT_BOOT_ESTIMATE


# --------------------------------------------------------------------------- writes


class Intent(NamedTuple):
    """One launch intent of an evaluation."""

    launch_id: str
    queue: str
    provider: str
    reason: str
    spec_key: str | None = None
    """What decide() rents it as (`policy.warm.spec_key`): a warm pool resumes only its like."""
    fallbacks: tuple[str, ...] = ()
    """The other providers decide() let it rent from (`Launch.fallbacks`)."""
    interruptible: bool = False
    """decide() let it rent at the queue's bid (`Launch.interruptible`)."""


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
                "placement": {"providers": [provider, *fallbacks]} if fallbacks else None,
                "interruptible": interruptible,
            }
            for launch_id, queue, provider, reason, key, fallbacks, interruptible in (
                Intent(*i) for i in intents
            )
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

SLOW_HOST_EVENT = ("boot", "slow_host")
"""(kind, action) of the event saying a cold boot was slow and why its host is avoided."""


@dataclass(frozen=True)
class SlowHost:
    """A host to avoid after a slow cold boot on it (`policy.boots.judge_boot`)."""

    provider: str
    host_id: str
    reason: str


@dataclass(frozen=True)
class Readied:
    """`mark_ready` made the move: a warm hit (`resumed`) or a cold boot, and `slow_host` when
    that boot was slow — its host is to be avoided by the caller once its transaction has
    committed (`control.resume.avoid_host`: avoided hosts are written on a connection of their
    own, which an open write would hold up on SQLite)."""

    resumed: bool = False
    slow_host: SlowHost | None = None


def mark_ready(
    session: Session,
    launch_id: str,
    queue: str,
    provider: str,
    now: datetime,
    why: str,
    *,
    judge: bool = True,
) -> Readied | None:
    """booting (or resuming from a warm pool) -> ready at the first proof of life of the
    machine's worker, wherever it is seen (its agent's heartbeat, Celery remote control,
    reconcile): one conditional write, one event, and the rental counts as good (the (queue,
    provider) backoff is cleared). A `Readied` if this call made the move (of two racing
    callers, one does), else None. A resumed machine's event is a warm hit. A cold boot is
    judged (`judge`): slow on its host (`slow_boot`), an event says why and `slow_host` names
    the host to avoid."""
    if move(session, launch_id, InstanceState.BOOTING, InstanceState.READY, now, why):
        kind, action = READY_EVENT
        record_events(session, [event(kind, action, why, queue=queue, launch_id=launch_id)], now)
        clear_backoff(session, queue, provider)
        return Readied(slow_host=slow_boot(session, launch_id, queue, now) if judge else None)
    if move(session, launch_id, InstanceState.RESUMING, InstanceState.READY, now, why):
        record_events(session, [warm_event("hit", why, queue, launch_id)], now)
        return Readied(resumed=True)
    return None


def slow_boot(session: Session, launch_id: str, queue: str, now: datetime) -> SlowHost | None:
    """The cold boot of `launch_id`, ready at `now`, judged against the earlier cold boots of
    its (provider, GPU) (`boot_stats`' samples, itself left out): slow (`policy.boots`) on a
    known host, an event recording why, and the host to avoid; else None. Control-plane times
    only (created_at -> now, on the store's clock), never what the machine reported. Two
    queries."""
    row = session.execute(
        select(
            Instance.provider, Instance.gpu, Instance.host_id, Instance.created_at, Instance.resumes
        ).where(Instance.launch_id == launch_id)
    ).one_or_none()
    if row is None or not row.host_id or row.resumes:
        return None
    same_gpu = Instance.gpu.is_(None) if row.gpu is None else Instance.gpu == row.gpu
    earlier = cold_boots(
        session,
        now - BOOT_STATS_WINDOW,
        per=[("provider", "gpu")],
        latest=BOOT_STATS_SAMPLES,
        where=[Instance.provider == row.provider, same_gpu, Instance.launch_id != launch_id],
    )
    seconds = (now - row.created_at).total_seconds()
    verdict = judge_boot(seconds, [b.seconds for b in earlier])
    if verdict is None:
        return None
    reason = verdict.reason(row.provider, row.gpu, row.host_id)
    kind, action = SLOW_HOST_EVENT
    details = {
        "provider": row.provider,
        "host": row.host_id,
        "gpu": row.gpu,
        "seconds": round(verdict.seconds, 3),
        "median_seconds": round(verdict.median, 3),
        "samples": verdict.samples,
        "factor": verdict.factor,
    }
    record_events(
        session,
        [event(kind, action, reason, queue=queue, launch_id=launch_id, details=details)],
        now,
    )
    return SlowHost(row.provider, row.host_id, reason)


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


def retry_mark(step: str) -> str:
    return f"retrying {step}: "


def unnoted_retries(session: Session, retries: Collection[tuple[str, str]]) -> set[str]:
    """Of these (launch id, step) retries, the launches whose row does not say yet that the step
    is being retried (one query): a drain waiting on a busy machine is retried every round, and
    writing each of them every round was 1,876 UPDATEs a round at 20,000 machines
    (`benchmarks/reconcile.py`)."""
    steps = dict(retries)
    if not steps:
        return set()
    rows = session.execute(
        select(Instance.launch_id, Instance.state_reason).where(Instance.launch_id.in_(list(steps)))
    )
    return {
        launch_id
        for launch_id, reason in rows
        if not (reason or "").startswith(retry_mark(steps[launch_id]))
    }


def note_retry(session: Session, launch_id: str, step: str, reason: str) -> bool:
    """Mark a row's step as being retried; True the first time since its state last changed
    (so the retry is audited once, not on every reconcile)."""
    mark = retry_mark(step)
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


def unheard_since(heard_at: datetime | None) -> Any:
    """The `only_if` of a move made for silence: no sign of life (heartbeat or broker reply,
    both written to `last_heartbeat_at`) written after `heard_at`, the last one its judge read."""
    if heard_at is None:
        return Instance.last_heartbeat_at.is_(None)
    return or_(Instance.last_heartbeat_at.is_(None), Instance.last_heartbeat_at <= heard_at)


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
    {
        "last_heartbeat_at",
        "running_tasks",
        "gpu_utilisation",
        "last_task_at",
        "worker_name",
        "tasks",
        "acks_late",
    }
)


def note_heartbeat(
    session: Session, launch_id: str, values: Mapping[str, Any]
) -> InstanceState | None:
    """What its agent's heartbeat said (some of HEARTBEAT_COLUMNS; the API decides which).
    Returns the row's state as this write found it (None: no such row): the state read when
    the token was checked may have moved since, and the write holds the row until commit."""
    unknown = set(values) - HEARTBEAT_COLUMNS
    if unknown:
        raise ValueError(f"not a heartbeat column: {', '.join(sorted(unknown))}")
    state = session.execute(
        update(Instance)
        .where(Instance.launch_id == launch_id)
        .values(**values)
        .returning(Instance.state)
        .execution_options(synchronize_session=False)
    ).scalar_one_or_none()
    return InstanceState(state) if state is not None else None


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
    reason, joined = keyed_values(
        session, {k: v[:2000] for k, v in reasons.items()}, Instance.launch_id
    )
    values = {
        "state": dst,
        STATE_SINCE[dst]: now,
        "state_reason": reason,
        "updated_at": now,
        **fields,
    }
    where = [Instance.state == src]
    where.append(Instance.launch_id.in_(list(reasons)) if joined is None else joined)
    result = session.execute(
        update(Instance)
        .where(*where)
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
    session: Session,
    queue: str,
    provider: str,
    now: datetime,
    config: Backoff,
    error: str,
    cause: BackoffCause = "error",
) -> BackoffState:
    """One more failure of (queue, provider): the backoff grows (and survives restarts);
    `cause` says what failed, for `status`."""
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
                cause=cause,
            )
        )
    else:
        row.failures, row.until, row.last_error = state.failures, state.until, state.last_error
        row.cause = cause
    session.flush()
    return state


def set_handback_due(session: Session, launch_id: str, due: datetime) -> None:
    """The provider says the machine no longer runs: its jobs are handed back from `due` (once:
    an earlier mark is kept)."""
    session.execute(
        update(Instance)
        .where(Instance.launch_id == launch_id, Instance.handback_due_at.is_(None))
        .values(handback_due_at=due)
        .execution_options(synchronize_session=False)
    )


def pending_handbacks(session: Session, limit: int = 500) -> list[tuple[str, str]]:
    """(launch id, queue) of machines whose jobs are due to be handed back and are not yet."""
    return [
        (r.launch_id, r.queue)
        for r in session.execute(
            select(Instance.launch_id, Instance.queue)
            .where(Instance.handback_due_at.is_not(None), Instance.handback_done_at.is_(None))
            .order_by(Instance.handback_due_at)
            .limit(limit)
        )
    ]


HANDBACK_EVENT = "handback"
"""Events of a lost machine's jobs: requeued by its broker (`requeued`: RabbitMQ closed its
user's connections), left to the broker's own redelivery (`left`), claimed running with early
acks (`lost`: one per machine, the ids its word only), and forged kombu mutexes deleted
(`forged_mutex`)."""
PREEMPTION_EVENT = "preemption"
"""Events of interruptible machines stopped by their provider (action `preempted`)."""


def preemptions_on_host(session: Session, provider: str, host: str, since: datetime) -> int:
    """Machines of `provider` on `host` preempted since `since` (events joined to their rows:
    a host that preempts often is avoided for a while). One query."""
    return int(
        session.scalar(
            select(func.count())
            .select_from(ScaleEvent)
            .join(Instance, Instance.launch_id == ScaleEvent.launch_id)
            .where(
                ScaleEvent.kind == PREEMPTION_EVENT,
                ScaleEvent.at >= since,
                Instance.provider == provider,
                Instance.host_id == host,
            )
        )
        or 0
    )


def finish_handback(session: Session, launch_id: str, now: datetime) -> bool:
    """Mark the hand-back done; True for the one caller that marks it (its events are written
    once, whoever raced it)."""
    result = session.execute(
        update(Instance)
        .where(Instance.launch_id == launch_id, Instance.handback_done_at.is_(None))
        .values(handback_done_at=now)
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0))


def _cause(value: str | None) -> BackoffCause | None:
    return next((c for c in BACKOFF_CAUSES if c == value), None)


def try_provider(session: Session, launch_id: str, provider: str) -> bool:
    """A launch across providers is about to send its create to `provider`: the row names it
    (reconcile looks an ambiguous create up there) and lists it among those tried, before the
    create leaves. Conditional on the row still creating (an operator's cancel wins)."""
    row = session.scalars(
        select(Instance).where(Instance.launch_id == launch_id).with_for_update()
    ).one_or_none()
    if row is None or row.state != InstanceState.CREATING:
        return False
    placement = dict(row.placement or {})
    tried = [p for p in placement.get("tried", []) if p != provider]
    placement["tried"] = [*tried, provider]
    row.provider, row.placement = provider, placement
    session.flush()
    return True


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


def last_event_at(session: Session, launch_id: str, kind: str, action: str) -> datetime | None:
    """When the newest (kind, action) event of one machine was written, or None (the
    `scale_events` launch index makes it one short lookup)."""
    return session.scalar(
        select(func.max(ScaleEvent.at)).where(
            ScaleEvent.launch_id == launch_id,
            ScaleEvent.kind == kind,
            ScaleEvent.action == action,
        )
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

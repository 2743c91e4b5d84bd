"""SQLAlchemy models: the state the control loop must never lose.

Every table here survives a restart; that is the point of keeping it in the database instead of
in memory. Timestamps are timezone-aware UTC (`UtcDateTime`) on PostgreSQL and SQLite alike.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from autoscaler.lifecycle import LIVE_STATES, InstanceState

__all__ = ["LIVE_STATES", "InstanceState"]


class UtcDateTime(TypeDecorator[datetime]):
    """Aware datetimes in, aware UTC datetimes out, even on SQLite (which stores naive text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use an aware UTC datetime")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UtcDateTime(),
        dict[str, Any]: JSON(),
    }


def utcnow() -> datetime:
    return datetime.now(UTC)


class Installation(Base):
    """One row: this installation's id, stamped on every machine it creates (ownership)."""

    __tablename__ = "installation"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    installation_id: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ProviderRow(Base):
    """A registered provider: its kind, options and encrypted key (`providers.base.Provider` is
    the client of one)."""

    __tablename__ = "providers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    kind: Mapped[str] = mapped_column(String(20))
    credentials_encrypted: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)
    options: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class ConfigVersion(Base):
    """The whole effective config (providers, limits, every queue) as one versioned document.

    The control loop always runs the newest version; every version is kept with who changed it,
    when and why, so any change can be traced and rolled back.
    """

    __tablename__ = "config_versions"

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    document: Mapped[dict[str, Any]] = mapped_column()
    changed_by: Mapped[str] = mapped_column(String(200))
    changed_at: Mapped[datetime] = mapped_column(default=utcnow)
    comment: Mapped[str | None] = mapped_column(Text, default=None)


class Instance(Base):
    """One rented (or to-be-rented) machine, with a timestamp for each lifecycle state."""

    __tablename__ = "instances"
    __table_args__ = (
        Index("ix_instances_queue_state", "queue", "state"),
        Index("ix_instances_provider_pid", "provider", "provider_instance_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    launch_id: Mapped[str] = mapped_column(String(64), unique=True)
    queue: Mapped[str] = mapped_column(String(200))
    provider: Mapped[str] = mapped_column(String(100))
    state: Mapped[InstanceState] = mapped_column(
        Enum(
            InstanceState,
            native_enum=False,
            length=20,
            values_callable=lambda e: [m.value for m in e],
        )
    )
    state_reason: Mapped[str | None] = mapped_column(Text, default=None)
    provider_instance_id: Mapped[str | None] = mapped_column(String(100), default=None)
    host_id: Mapped[str | None] = mapped_column(String(100), default=None)
    gpu: Mapped[str | None] = mapped_column(String(100), default=None)
    price_per_hour: Mapped[float | None] = mapped_column(Float, default=None)
    offer: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    placement: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    """A launch across providers: {"providers": [...]} it may rent from (decide()'s, in the
    order written) and {"tried": [...]} those a create was sent to, so reconcile looks an
    ambiguous create up on each (`control.placement`)."""
    decision_id: Mapped[int | None] = mapped_column(
        ForeignKey("scale_events.id", ondelete="SET NULL"), default=None
    )
    """The `launch` event of the decision that asked for this machine (the audit trail's link)."""
    config_version: Mapped[int | None] = mapped_column(Integer, default=None)
    """The config version `decide()` judged when it asked for this machine: the launch rents
    exactly that, and drain and terminate read the queue and provider from it (None: a row
    from before versions were frozen; the newest is used)."""
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    drain_requested: Mapped[bool] = mapped_column(default=False)
    pending_at: Mapped[datetime | None] = mapped_column(default=None)
    creating_at: Mapped[datetime | None] = mapped_column(default=None)
    booting_at: Mapped[datetime | None] = mapped_column(default=None)
    ready_at: Mapped[datetime | None] = mapped_column(default=None)
    draining_at: Mapped[datetime | None] = mapped_column(default=None)
    drained_at: Mapped[datetime | None] = mapped_column(default=None)
    terminating_at: Mapped[datetime | None] = mapped_column(default=None)
    terminated_at: Mapped[datetime | None] = mapped_column(default=None)
    failed_at: Mapped[datetime | None] = mapped_column(default=None)
    lost_at: Mapped[datetime | None] = mapped_column(default=None)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(default=None)
    last_task_at: Mapped[datetime | None] = mapped_column(default=None)
    running_tasks: Mapped[int] = mapped_column(Integer, default=0)
    tasks: Mapped[list[str] | None] = mapped_column(JSON, default=None)
    """The ids of the jobs its worker last said it holds (its own heartbeat): what is handed
    back to the broker if the machine is lost."""
    acks_late: Mapped[bool | None] = mapped_column(default=None)
    """Its worker's `task_acks_late`, as its agent last said."""
    handback_due_at: Mapped[datetime | None] = mapped_column(default=None)
    """Lost at its provider (gone, dead, preempted): its jobs are handed back from then."""
    handback_done_at: Mapped[datetime | None] = mapped_column(default=None)
    interruptible: Mapped[bool] = mapped_column(default=False)
    """Rented at a bid (or, while pending, allowed to be: decide()'s `Launch.interruptible`)."""
    gpu_utilisation: Mapped[float | None] = mapped_column(Float, default=None)
    worker_name: Mapped[str | None] = mapped_column(String(200), default=None)
    worker_token_hash: Mapped[str | None] = mapped_column(String(128), default=None, unique=True)
    broker_user: Mapped[str | None] = mapped_column(String(100), default=None)
    agent_registered_at: Mapped[datetime | None] = mapped_column(default=None)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(default=None)
    """An operator drained the machine before it was ready: it is destroyed as soon as it
    exists (a launch in flight sees this when the provider answers)."""
    silence_noted_at: Mapped[datetime | None] = mapped_column(default=None)
    """When a reconcile round last found its worker silent past its limit (destroyed only if a
    second round finds it so)."""
    spec_key: Mapped[str | None] = mapped_column(String(64), default=None)
    """What it was rented as (`policy.warm.spec_key` of its intent's config): a stopped machine
    is resumed only for the same spec."""
    keep_warm: Mapped[bool] = mapped_column(default=False)
    """`decide()` gave it a place in its queue's warm pool: drained, it is stopped, not
    destroyed."""
    storage_price_per_hour: Mapped[float | None] = mapped_column(Float, default=None)
    stopping_at: Mapped[datetime | None] = mapped_column(default=None)
    stopped_at: Mapped[datetime | None] = mapped_column(default=None)
    resuming_at: Mapped[datetime | None] = mapped_column(default=None)
    resumes: Mapped[int] = mapped_column(Integer, default=0)
    """How many times it was resumed from the warm pool."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class RentalBackoff(Base):
    """A failed rental backs (queue, provider) off exponentially; survives restarts."""

    __tablename__ = "rental_backoffs"

    queue: Mapped[str] = mapped_column(String(200), primary_key=True)
    provider: Mapped[str] = mapped_column(String(100), primary_key=True)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    until: Mapped[datetime] = mapped_column()
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    cause: Mapped[str | None] = mapped_column(String(20), default=None)
    """What failed, for `status`: `policy.snapshot.BACKOFF_CAUSES`."""
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class ProviderRateLimit(Base):
    """A provider held: no call to it (launch, destroy, stop, start) before `until`, in any
    worker process, because it answered 429 with a reset beyond what a call may wait (`cause`
    `rate_limit`), or gave no answer within a step's deadline (`unanswered`: reconcile's next
    answered list lifts it). Survives restarts."""

    __tablename__ = "provider_rate_limits"

    provider: Mapped[str] = mapped_column(String(100), primary_key=True)
    until: Mapped[datetime] = mapped_column()
    reason: Mapped[str | None] = mapped_column(Text, default=None)
    since: Mapped[datetime] = mapped_column()
    cause: Mapped[str] = mapped_column(
        String(16), default="rate_limit", server_default="rate_limit"
    )


class AvoidedHost(Base):
    """A host that failed us (e.g. Vast OCI errors, never booted): excluded until `until`."""

    __tablename__ = "avoided_hosts"

    provider: Mapped[str] = mapped_column(String(100), primary_key=True)
    host_id: Mapped[str] = mapped_column(String(100), primary_key=True)
    reason: Mapped[str] = mapped_column(Text)
    until: Mapped[datetime] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ScaleEvent(Base):
    """The audit trail: every decision and action, with its human-readable reason."""

    __tablename__ = "scale_events"
    __table_args__ = (
        Index("ix_scale_events_queue_at", "queue", "at"),
        Index("ix_scale_events_launch_id", "launch_id"),
        Index("ix_scale_events_at", "at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    queue: Mapped[str | None] = mapped_column(String(200), default=None)
    kind: Mapped[str] = mapped_column(String(40))
    action: Mapped[str] = mapped_column(String(40))
    launch_id: Mapped[str | None] = mapped_column(String(64), default=None)
    reason: Mapped[str] = mapped_column(Text)
    details: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)


class Lease(Base):
    """A named lock with an expiry (beat leader, per-queue evaluation): one holder at a time."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[datetime] = mapped_column()
    acquired_at: Mapped[datetime] = mapped_column(default=utcnow)


class TickSlot(Base):
    """One row per (queue, slot): a duplicate tick for the same slot inserts nothing and stops."""

    __tablename__ = "tick_slots"
    __table_args__ = (Index("ix_tick_slots_claimed_at", "claimed_at"),)

    queue: Mapped[str] = mapped_column(String(200), primary_key=True)
    slot: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    claimed_by: Mapped[str] = mapped_column(String(200))
    claimed_at: Mapped[datetime] = mapped_column(default=utcnow)


class MockMachine(Base):
    """Machines of the mock provider, in the database so every process sees the same ones."""

    __tablename__ = "mock_machines"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    provider: Mapped[str] = mapped_column(String(100), index=True)
    label: Mapped[str] = mapped_column(String(200), unique=True)
    env: Mapped[dict[str, Any]] = mapped_column(default=dict)
    gpu: Mapped[str] = mapped_column(String(100))
    price_per_hour: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(20))
    boots_at: Mapped[datetime] = mapped_column()
    will_fail: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    destroyed_at: Mapped[datetime | None] = mapped_column(default=None)


class QueueHeadSighting(Base):
    """When a queue's head message id was first seen: bounds the age of unstamped messages."""

    __tablename__ = "queue_head_sightings"

    source: Mapped[str] = mapped_column(String(300), primary_key=True)
    queue: Mapped[str] = mapped_column(String(200), primary_key=True)
    message_id: Mapped[str] = mapped_column(String(200))
    first_seen_at: Mapped[datetime] = mapped_column()


class ManualTargetRow(Base):
    """An operator's fixed worker count for a queue (`autoscaler scale`), until it expires
    (`policy.snapshot.ManualTarget` is what the loop reads of it)."""

    __tablename__ = "manual_targets"

    queue: Mapped[str] = mapped_column(String(200), primary_key=True)
    workers: Mapped[int] = mapped_column(Integer)
    until: Mapped[datetime] = mapped_column()
    set_by: Mapped[str] = mapped_column(String(200))
    set_at: Mapped[datetime] = mapped_column(default=utcnow)


class QueueStatus(Base):
    """The latest evaluation of each queue: its numbers, what it wants and why (status, API)."""

    __tablename__ = "queue_status"

    queue: Mapped[str] = mapped_column(String(200), primary_key=True)
    evaluated_at: Mapped[datetime] = mapped_column()
    config_version: Mapped[int] = mapped_column(Integer)
    status: Mapped[dict[str, Any]] = mapped_column()
    history: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), default=None)
    """The queue's quiet gaps as the evaluations saw them (`policy.history.QueueHistory`):
    {"gaps": [seconds, ...], "quiet_since": ISO time or null}; SQL NULL when an evaluation
    had none to write (the stored one is then kept)."""


class MetricReading(Base):
    """The last good reading of a queue from one source: what a failing source falls back to.

    Kept in the store, not in a process, so every worker process falls back to the same numbers.
    """

    __tablename__ = "metric_readings"

    source: Mapped[str] = mapped_column(String(300), primary_key=True)
    queue: Mapped[str] = mapped_column(String(200), primary_key=True)
    reading: Mapped[dict[str, Any]] = mapped_column()
    read_at: Mapped[datetime] = mapped_column()


class WorkerSighting(Base):
    """A Celery worker seen through a watched broker's remote control, hand-made or ours, or a
    hand-made machine's agent heartbeat. `domain` is where it was heard
    (`metrics.registry.broker_domain`, or `store.worker_sightings.ENROLLED_DOMAIN`): it counts
    for that domain's queues alone, and one worker name heard in two domains is two sightings."""

    __tablename__ = "worker_sightings"

    domain: Mapped[str] = mapped_column(String(300), primary_key=True)
    worker: Mapped[str] = mapped_column(String(200), primary_key=True)
    queues: Mapped[dict[str, Any]] = mapped_column()  # {"queues": [...]} (JSON object)
    running: Mapped[int] = mapped_column(Integer, default=0)
    seen_at: Mapped[datetime] = mapped_column()


class OrphanSighting(Base):
    """A machine with our label that no live row owns, and when reconcile first saw it."""

    __tablename__ = "orphan_sightings"

    provider: Mapped[str] = mapped_column(String(100), primary_key=True)
    provider_instance_id: Mapped[str] = mapped_column(String(100), primary_key=True)
    label: Mapped[str] = mapped_column(String(200))
    first_seen_at: Mapped[datetime] = mapped_column()


class ApiKey(Base):
    """A key of the server API: `admin` (every admin endpoint) or `enrolment` (a hand-made
    machine's agent registers with it). Only the SHA-256 of the key is stored; a revoked key
    keeps its row (audit) and opens nothing."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(20))
    name: Mapped[str] = mapped_column(String(200))
    key_hash: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)
    queues: Mapped[list[str] | None] = mapped_column(JSON, default=None)
    """An enrolment key's queues: the only ones its machine may heartbeat for or deploy (None:
    a key made before keys were bound to queues, which opens none)."""


class QueueSample(Base):
    """A queue's numbers at one reading, for the dashboard's chart: pending jobs (the metric
    reading of that time) and the machines that served it. Written by every evaluation tick and
    by the API whenever it shows the numbers, keyed by the reading's own time, so two writers of
    the same reading write one row. Kept for a week."""

    __tablename__ = "queue_samples"
    __table_args__ = (Index("ix_queue_samples_at", "at"),)

    queue: Mapped[str] = mapped_column(String(200), primary_key=True)
    at: Mapped[datetime] = mapped_column(primary_key=True)
    pending: Mapped[int] = mapped_column(Integer, default=0)
    running: Mapped[int | None] = mapped_column(Integer, default=None)
    workers: Mapped[int] = mapped_column(Integer, default=0)
    booting: Mapped[int] = mapped_column(Integer, default=0)
    desired: Mapped[int | None] = mapped_column(Integer, default=None)


class JobRecord(Base):
    """One job a worker finished, as its agent reported it: the queue's own traffic, for the
    policy's mean runtime and for `autoscaler trace export`. `arrived_at` is the producer's
    publish stamp (None for unstamped producers). Kept for KEEP (store/job_records.py)."""

    __tablename__ = "job_records"
    __table_args__ = (
        # one row per job and reporter: a machine naming another's job adds its own row, it
        # never stands in for the row of the machine that ran it
        UniqueConstraint("queue", "task_id", "reporter", name="uq_job_records_queue_task"),
        # (queue, finished_at) finds a queue's last day; runtime_s makes the mean an index scan
        Index("ix_job_records_queue_finished", "queue", "finished_at", "runtime_s"),
        Index("ix_job_records_finished", "finished_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    queue: Mapped[str] = mapped_column(String(200))
    task_id: Mapped[str] = mapped_column(String(200))
    worker: Mapped[str] = mapped_column(String(200))
    reporter: Mapped[str] = mapped_column(String(200), default="", server_default="")
    """Who reported it, as the control plane knows it (a launch id; `enrolled:KEY:NAME` for a
    hand-made machine), never the machine's own word."""
    arrived_at: Mapped[datetime | None] = mapped_column(default=None)
    started_at: Mapped[datetime] = mapped_column()
    finished_at: Mapped[datetime] = mapped_column()
    runtime_s: Mapped[float] = mapped_column(Float)


class BootPhase(Base):
    """One phase of one boot of a machine, as its agent reported it (`policy.boots.BOOT_PHASES`:
    started, registered, code fetched, requirements installed, worker up, first job). `boot` is
    the row's `resumes` when it was reported: 0 for the cold boot, n for the n-th resume from
    the warm pool. Kept once (the first report wins); `at` is the agent's time clamped into
    [the boot's start, `received_at`], `received_at` the store's clock. The provider, GPU, host
    (or data centre) and queue are the instance row's, never the agent's word. For display only
    (where the time went): no decision reads this table. Kept for KEEP
    (store/boot_phases.py)."""

    __tablename__ = "boot_phases"
    __table_args__ = (Index("ix_boot_phases_received_at", "received_at"),)

    launch_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    boot: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    phase: Mapped[str] = mapped_column(String(40), primary_key=True)
    at: Mapped[datetime] = mapped_column()
    received_at: Mapped[datetime] = mapped_column()
    queue: Mapped[str] = mapped_column(String(200))
    provider: Mapped[str] = mapped_column(String(100))
    gpu: Mapped[str | None] = mapped_column(String(100), default=None)
    host_id: Mapped[str | None] = mapped_column(String(100), default=None)


class ReportBudget(Base):
    """What one reporter's heartbeats may still write (`policy.reports`): finished jobs and
    events, refilled with time. Forgotten a day after its last report."""

    __tablename__ = "report_budgets"

    reporter: Mapped[str] = mapped_column(String(200), primary_key=True)
    jobs: Mapped[float] = mapped_column(Float)
    events: Mapped[float] = mapped_column(Float)
    at: Mapped[datetime] = mapped_column(index=True)
    day: Mapped[str] = mapped_column(String(10))
    today: Mapped[int] = mapped_column(Integer, default=0)
    dropped_jobs: Mapped[int] = mapped_column(Integer, default=0)
    dropped_events: Mapped[int] = mapped_column(Integer, default=0)
    told_at: Mapped[datetime | None] = mapped_column(default=None)


class InstanceTransition(Base):
    """One state change of a machine's row (`instances`), written in the transaction of the move
    itself (`store/transitions.py`): the row keeps only the latest time of each state, this its
    whole history, so a machine stopped and resumed twice bills each stop at its storage price
    (`policy.billing`). `src` None: the row's first state (its intent written, or the first
    state a backfill could know). Kept as long as its instance row is (`store/retention.py`)."""

    __tablename__ = "instance_transitions"
    __table_args__ = (Index("ix_instance_transitions_launch_id_id", "launch_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    launch_id: Mapped[str] = mapped_column(String(64))
    src: Mapped[InstanceState | None] = mapped_column(
        Enum(
            InstanceState,
            native_enum=False,
            length=20,
            values_callable=lambda e: [m.value for m in e],
        ),
        default=None,
    )
    dst: Mapped[InstanceState] = mapped_column(
        Enum(
            InstanceState,
            native_enum=False,
            length=20,
            values_callable=lambda e: [m.value for m in e],
        )
    )
    at: Mapped[datetime] = mapped_column()

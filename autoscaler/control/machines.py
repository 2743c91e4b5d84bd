"""A machine's lifecycle as its agent and the broker report it, and what each report means.

An agent registers, heartbeats, reports its boot's phases and, once drained, says so (through
the API, with the machine's own worker token: `api/routers/worker.py` parses and answers, this
module decides); a worker without an agent answers remote control through the watched broker
(`control.observe`). Either way the first proof of life of a machine's worker makes it ready
(`mark_ready`, the one way a machine becomes ready: reconcile and the drain step come here
too), with its event, its rental counted as good and its cold boot judged for a slow host.
A failed rental backs off (`rental_failed`: how long is `policy.backoff`'s).

The store writes what it is told (`store.moves`, `store.heartbeats`, `store.events`, …); what
to write, and when, is decided here. Every function works in its caller's transaction and
returns what the caller does once it has committed: a host to avoid (`SlowHost`, written on a
connection of its own, which an open write would hold up on SQLite), a step to send.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol

from autoscaler.config.models import Backoff
from autoscaler.lifecycle import MAY_SERVE, InstanceState
from autoscaler.policy.backoff import after_failure
from autoscaler.policy.boots import judge_boot
from autoscaler.policy.reports import Grant, Want
from autoscaler.policy.snapshot import BackoffCause, BackoffState
from autoscaler.store import (
    backoffs,
    boot_phases,
    boots,
    events,
    heartbeats,
    job_records,
    moves,
    report_budgets,
)
from autoscaler.store.db import Session
from autoscaler.store.instances import InstanceDetails

S = InstanceState

Next = Literal["stop", "terminate"]
"""The step a finished drain sends: stop (a place in the warm pool) or terminate."""

HEARTBEAT_INTERVAL = 10.0
"""Seconds between an agent's heartbeats, as its registration is answered."""

CRASH_EVENT_EVERY = timedelta(seconds=60)
"""At most one `crashed` event per machine in this span: an agent restarts a crashing worker
and says so with its next heartbeat (every 10 s), so an honest machine's crash loop still
shows, while a hostile one (2,051 `crashed` reports in 8 s, issue 33) cannot bury the audit
trail; the machine's state is moved by every report as before."""

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
    committed (`control.steps.resume.avoid_host`: avoided hosts are written on a connection of their
    own, which an open write would hold up on SQLite)."""

    resumed: bool = False
    slow_host: SlowHost | None = None


# --------------------------------------------------------------------------- the agent's reports


def register(session: Session, machine: InstanceDetails, worker_name: str, now: datetime) -> None:
    """Its agent registered, naming its worker: an event (within the machine's report budget)
    and the row's worker name. Not yet a sign of the worker's life (see
    `store.heartbeats.note_registered`)."""
    granted = report_budgets.spend(session, machine.launch_id, Want(events=1), now)
    said = [
        events.event(
            "agent",
            "register",
            f"agent {worker_name} registered",
            queue=machine.queue,
            launch_id=machine.launch_id,
        )
    ]
    events.record(session, said[: granted.events] + _told(machine, granted), now)
    heartbeats.note_registered(session, machine.launch_id, worker_name, now)


class FinishedJob(Protocol):
    """A job the worker finished, as its agent reports it (`wire.JobReport`): epoch
    seconds on the machine's clock."""

    @property
    def id(self) -> str: ...
    @property
    def queue(self) -> str | None: ...
    @property
    def published_at(self) -> float | None: ...
    @property
    def started_at(self) -> float: ...
    @property
    def finished_at(self) -> float: ...


def job_rows(
    jobs: Sequence[FinishedJob], worker: str, reporter: str, queues: list[str], now: datetime
) -> list[dict[str, Any]]:
    """Rows for `job_records`, each kept as `reporter`'s (the control plane's name for the
    machine, never its word): a job counts for the queue it names when the worker serves it,
    else for the worker's first queue. Times after now are clamped to now, an end before the
    start to the start, a publish stamp after the start to the start (clocks disagree)."""

    def at(epoch: float) -> datetime:
        return min(datetime.fromtimestamp(epoch, UTC), now)

    rows = []
    for j in jobs:
        started = at(j.started_at)
        finished = max(at(j.finished_at), started)
        arrived = min(at(j.published_at), started) if j.published_at is not None else None
        rows.append(
            {
                "queue": j.queue if j.queue in queues else queues[0],
                "task_id": j.id,
                "worker": worker[:200],
                "reporter": reporter[:200],
                "arrived_at": arrived,
                "started_at": started,
                "finished_at": finished,
                "runtime_s": (finished - started).total_seconds(),
            }
        )
    return rows


@dataclass(frozen=True)
class Report:
    """What an agent's heartbeat says of its worker (`state`: starting, idle, busy, draining
    or crashed), parsed and bounded by the API."""

    state: str
    running_tasks: int = 0
    last_task_at: datetime | None = None
    gpu_utilisation: float | None = None
    detail: str | None = None
    jobs: Sequence[FinishedJob] = ()
    tasks: Sequence[str] = ()
    """Ids of the jobs its worker holds now: what is handed back to the broker if the machine
    is lost (`control.steps.handback`)."""
    acks_late: bool | None = None


@dataclass(frozen=True)
class HeartbeatVerdict:
    """A heartbeat's answer: the machine's state as the heartbeat's write found it (or as it
    moved it: ready), and a slow cold boot's host for the caller to avoid after its commit."""

    state: InstanceState
    slow_host: SlowHost | None = None

    @property
    def drain(self) -> bool:
        """Drain and start nothing: any state but MAY_SERVE (a cancel or a boot timeout
        committed since the token check included)."""
        return self.state not in MAY_SERVE


def heartbeat(
    session: Session, machine: InstanceDetails, report: Report, now: datetime
) -> HeartbeatVerdict:
    """The agent's word on its worker. Every state but `starting` and `crashed` says the
    worker is up (the agent sends its first heartbeat as it starts the worker): a booting or
    resuming machine is ready at once (`mark_ready`). `crashed`: no sign of life, no running
    task, an event (at most one per CRASH_EVENT_EVERY); reconcile replaces the machine. The
    finished jobs and events it brings are written within its report budget, before the row's
    own UPDATE (its lock is then held only for the commit's tail)."""
    up = report.state not in ("starting", "crashed")
    values: dict[str, Any] = {
        "last_heartbeat_at": now,
        "running_tasks": report.running_tasks,
        "gpu_utilisation": report.gpu_utilisation,
        "tasks": list(dict.fromkeys(report.tasks)),
    }
    if report.acks_late is not None:
        values["acks_late"] = report.acks_late
    if not up:
        values.pop("last_heartbeat_at")
    if not machine.worker_name:
        values["worker_name"] = f"agent@{machine.launch_id}"
    busy = report.running_tasks > 0 or machine.running_tasks > 0
    if report.last_task_at is not None:
        values["last_task_at"] = min(report.last_task_at, now)
    elif busy:
        values["last_task_at"] = now
    said = []
    if report.state == "crashed":
        # the worker process died: no sign of life from it; reconcile replaces the machine
        values["running_tasks"] = 0
        last = events.last_at(session, machine.launch_id, "agent", "crashed")
        if last is None or now - last >= CRASH_EVENT_EVERY:
            why = f"the worker process crashed: {report.detail or 'no detail'}"
            said.append(
                events.event(
                    "agent", "crashed", why, queue=machine.queue, launch_id=machine.launch_id
                )
            )
    # what the report writes beyond its own row, within the machine's budget, first: the
    # instance row's UPDATE comes last, so its lock is held only for the commit's tail
    want = Want(jobs=len(report.jobs), events=len(said), running=report.running_tasks)
    granted = report_budgets.spend(session, machine.launch_id, want, now)
    worker = machine.worker_name or f"agent@{machine.launch_id}"
    jobs = job_rows(report.jobs[: granted.jobs], worker, machine.launch_id, [machine.queue], now)
    job_records.record(session, jobs, now)
    events.record(session, said[: granted.events] + _told(machine, granted), now)
    # the answer comes from the state this write found, not the token check's read: a cancel
    # or a boot timeout committed in between makes it drain, so no worker starts on a machine
    # that is being destroyed
    state = heartbeats.note_heartbeat(session, machine.launch_id, values) or S.TERMINATED
    slow = None
    if up and state in (S.BOOTING, S.RESUMING):
        why = "its worker is up (its agent's first heartbeat)"
        if state == S.RESUMING:
            why = "its worker is up again: resumed from the warm pool (its agent's heartbeat)"
        ready = mark_ready(session, machine.launch_id, machine.queue, machine.provider, now, why)
        if ready:
            state, slow = S.READY, ready.slow_host
    return HeartbeatVerdict(state, slow)


def _told(machine: InstanceDetails, granted: Grant) -> list[dict[str, Any]]:
    """The event saying what the machine's budget dropped, when it is time to say it."""
    if granted.tell is None:
        return []
    return [
        events.event(
            "agent",
            "reports_dropped",
            granted.tell,
            queue=machine.queue,
            launch_id=machine.launch_id,
        )
    ]


def phases(
    session: Session, machine: InstanceDetails, reported: Mapping[str, datetime], now: datetime
) -> tuple[int, list[str]]:
    """This machine's boot phases, for display only (`store.boot_phases`): (the boot they are
    of — the row's resumes, 0 for the cold boot —, the phases newly kept). No decision reads
    them: boot statistics and the slow-host rule use the control plane's own times."""
    kept = boot_phases.record(session, machine, reported, now)
    return machine.resumes or 0, kept


class NotDraining(ValueError):
    """A drained report from a machine nobody asked to drain (the message says its state)."""


def drained(session: Session, machine: InstanceDetails, now: datetime) -> Next | None:
    """Its agent reports its worker stopped after its last task: the drain ends as the loop's
    own drain step ends it (`finish_drain`). The step the caller sends once this transaction
    has committed ("stop" or "terminate"; None: someone else finished it). NotDraining for a
    machine that is neither draining nor drained."""
    if machine.state not in (S.DRAINING, S.DRAINED):
        raise NotDraining(f"this machine is {machine.state.value}: nobody asked it to drain")
    why = "its agent reports its worker stopped after its last task"
    return finish_drain(session, machine.launch_id, machine.queue, why, now)


def finish_drain(
    session: Session, launch_id: str, queue: str, why: str, now: datetime
) -> Next | None:
    """A worker found stopped (by the drain step, or by its agent through the API): draining ->
    drained -> stopping when `decide()` gave it a place in its queue's warm pool, else ->
    terminating, with its event, in `session`. Returns the step the caller sends next ("stop"
    or "terminate"); None when it was not draining or drained any more (someone else finished
    it)."""
    moves.move(session, launch_id, S.DRAINING, S.DRAINED, now, why)
    warm = moves.move(
        session,
        launch_id,
        S.DRAINED,
        S.STOPPING,
        now,
        f"drained: {why}; stopped for the warm pool",
        only_if=moves.KEPT_WARM,
    )
    if warm:
        stop = events.warm_event(
            "stop", f"drained ({why}): stopped for the warm pool", queue, launch_id
        )
        events.record(
            session,
            [events.event("drain", "drained", why, queue=queue, launch_id=launch_id), stop],
            now,
        )
        return "stop"
    if not moves.move(session, launch_id, S.DRAINED, S.TERMINATING, now, f"drained: {why}"):
        return None
    events.record(
        session, [events.event("drain", "drained", why, queue=queue, launch_id=launch_id)], now
    )
    return "terminate"


# --------------------------------------------------------------------------- the broker's word


def answered_remote_control(
    session: Session, ours: Mapping[str, tuple[str, int]], now: datetime
) -> list[SlowHost]:
    """Our machines' workers answered remote control (launch id -> (worker name, running
    tasks)): a booting or resuming one is ready at first sight, and each row gets what its
    worker said. Only machines with no agent registered: one whose agent heartbeats is known
    from its authenticated heartbeats alone, and a broker reply under its label (anyone who
    may publish on the broker can send one) moves nothing of its row. Returns the hosts of
    slow cold boots made ready here, for the caller to avoid once it has committed."""
    rows = heartbeats.heard_through_broker(session, ours)
    slow: list[SlowHost] = []
    for launch_id, _, state, queue, provider in rows:
        if state in (S.BOOTING, S.RESUMING):  # ready at first sight
            why = f"its worker is up ({ours[launch_id][0][:200]} answered remote control)"
            ready = mark_ready(session, launch_id, queue, provider, now, why)
            if ready and ready.slow_host is not None:
                slow.append(ready.slow_host)
    for launch_id, before, *_ in rows:
        name, running = ours[launch_id]
        # a task ran since the last look if one runs now or one ran then
        busy = running > 0 or before > 0
        heartbeats.note_worker(session, launch_id, name[:200], running, now, busy)
    return slow


# --------------------------------------------------------------------------- ready, failed


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
    if moves.move(session, launch_id, S.BOOTING, S.READY, now, why):
        kind, action = READY_EVENT
        said = events.event(kind, action, why, queue=queue, launch_id=launch_id)
        events.record(session, [said], now)
        backoffs.clear(session, queue, provider)
        return Readied(slow_host=slow_boot(session, launch_id, queue, now) if judge else None)
    if moves.move(session, launch_id, S.RESUMING, S.READY, now, why):
        events.record(session, [events.warm_event("hit", why, queue, launch_id)], now)
        return Readied(resumed=True)
    return None


def slow_boot(session: Session, launch_id: str, queue: str, now: datetime) -> SlowHost | None:
    """The cold boot of `launch_id`, ready at `now`, judged (`policy.boots.judge_boot`) against
    the earlier cold boots of its (provider, GPU) (`store.boots.peer_boots`, itself left out):
    slow on a known host, an event recording why, and the host to avoid; else None.
    Control-plane times only (created_at -> now, on the store's clock), never what the machine
    reported. Two queries."""
    row = boots.boot_of(session, launch_id)
    if row is None or not row.host_id or row.resumes:
        return None
    peers = boots.peer_boots(session, row.provider, row.gpu, now, leaving_out=launch_id)
    seconds = (now - row.created_at).total_seconds()
    verdict = judge_boot(seconds, peers)
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
    events.record(
        session,
        [events.event(kind, action, reason, queue=queue, launch_id=launch_id, details=details)],
        now,
    )
    return SlowHost(row.provider, row.host_id, reason)


def rental_failed(
    session: Session,
    queue: str,
    provider: str,
    now: datetime,
    config: Backoff,
    error: str,
    cause: BackoffCause = "error",
) -> BackoffState:
    """One more failure of (queue, provider): the backoff grows as `policy.backoff` says (and
    survives restarts; its row is locked while it is read and written, so two failures at once
    count twice); `cause` says what failed, for `status`."""
    previous = backoffs.locked(session, queue, provider)
    state = after_failure(previous, queue, provider, now, config, error[:2000])
    backoffs.write(session, queue, state, cause)
    return state


__all__ = [
    "CRASH_EVENT_EVERY",
    "HEARTBEAT_INTERVAL",
    "FinishedJob",
    "HeartbeatVerdict",
    "NotDraining",
    "Readied",
    "Report",
    "SlowHost",
    "answered_remote_control",
    "drained",
    "finish_drain",
    "heartbeat",
    "job_rows",
    "mark_ready",
    "phases",
    "register",
    "rental_failed",
    "slow_boot",
]

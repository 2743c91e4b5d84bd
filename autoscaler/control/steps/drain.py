"""Drain: stop a worker taking jobs, wait until nothing runs, then hand its machine over to be
destroyed. A busy worker is never destroyed here: a job it took between the drain decision and
now keeps running, and the step is simply tried again later.

A machine asked to drain before it is ready is cancelled instead: a pending one is never rented;
a creating one is destroyed as soon as its create returns (or its label is found); a booting (or
resuming) one whose worker has not shown itself (a heartbeat, a remote-control sighting, looked
for once more right now) is destroyed at once — its agent asks before starting the worker, so
nothing can be running — and one whose worker is up is ready, and drained like any other. A
stopped machine of a warm pool is destroyed (nothing runs on it).

For a Celery worker (seen through the watched broker's remote control):
    cancel_consumer for its queue -> confirm it no longer consumes it -> nothing running or
    reserved -> drained (warm shutdown sent) -> terminating.
A machine whose worker cannot be reached by remote control (an agent's worker, reporting
through heartbeats) is drained by the agent, which reports it drained; a machine with no
worker at all (the mock provider) is drained at once.

Once drained (or cancelled with a machine to destroy) the outcome sends terminate (or stop, for
the warm pool); reconcile sends it again if that is lost.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from autoscaler.brokers.base import SourceError
from autoscaler.control import machines
from autoscaler.control.observe import observe_celery_workers
from autoscaler.control.runtime import log, utc_now
from autoscaler.control.steps.frame import (
    AGAIN,
    Kind,
    Outcome,
    Step,
    StepRead,
    done,
    skipped,
    waiting,
)
from autoscaler.lifecycle import InstanceState
from autoscaler.store import events, heartbeats, instances, moves
from autoscaler.store.db import Session, store_now
from autoscaler.store.instances import InstanceDetails

S = InstanceState

DESTROYING = "cancelled: its machine is being destroyed"
STOPPING = "drained: its machine is being stopped for the warm pool"
CANCELLED = "cancelled before it was ready"
"""The reason every cancel of a machine not ready yet starts with."""

LOOKED = Outcome(Kind.AGAIN, "looked for its worker through remote control: read it again")


class _Next(enum.Enum):
    LOOK = "look for its worker first"
    DRAIN = "drain its worker"


@dataclass(frozen=True)
class DrainStep(Step[_Next]):
    """One step of draining a machine (idempotent); `reason` is who asked, for its events."""

    reason: str = "asked to drain it through autoscaler.drain"
    name = "drain"
    tries = 4

    def not_here(self, row: InstanceDetails | None) -> Outcome:
        return skipped("no such machine")  # any state: `read` sorts them out

    def read(self, session: Session, m: StepRead) -> _Next | Outcome:
        row, launch_id, now = m.row, m.launch_id, utc_now()
        if row.state in (S.PENDING, S.CREATING, S.BOOTING, S.RESUMING):
            queue_cfg = m.queue_cfg
            remote = queue_cfg is not None and m.rt.worker_probe(queue_cfg.metrics) is not None
            booting = row.state in (S.BOOTING, S.RESUMING)
            if booting and LOOKED not in m.before and remote and not _alive(row):
                return _Next.LOOK  # a worker already taking jobs is drained warm, never destroyed
            return _cancel(session, row, self.reason, now)
        if row.state == S.STOPPED:  # an operator empties the warm pool: nothing runs on it
            why = f"{self.reason}: destroyed from the warm pool"
            if not moves.move(session, launch_id, S.STOPPED, S.TERMINATING, now, why):
                return AGAIN
            event = events.warm_event("destroy", why, row.queue, launch_id)
            events.record(session, [event], now)
            return _destroying()
        if row.state == S.READY:  # an operator's drain: the tick's drains arrive as DRAINING
            moves.move(
                session, launch_id, S.READY, S.DRAINING, now, self.reason, drain_requested=False
            )
            events.record(
                session,
                [events.event("drain", "start", self.reason, queue=row.queue, launch_id=launch_id)],
                now,
            )
        elif row.state in (S.DRAINED, S.TERMINATING, S.STOPPING):
            return skipped(f"already leaving: it is {row.state.value}")
        elif row.state != S.DRAINING:
            return skipped(f"not draining ({row.state.value})")
        if row.agent_registered_at is not None:
            # its agent saw DRAINING in its heartbeat answer: it stops the worker (warm
            # shutdown, the running task finishes) and reports drained through the API
            return waiting("the agent drains its worker and reports drained")
        return _Next.DRAIN

    def act(self, m: StepRead, kept: _Next) -> Outcome:
        if kept is _Next.LOOK:
            queue_cfg = m.queue_cfg
            if m.loaded is not None and queue_cfg is not None:
                observe_celery_workers(m.rt, m.loaded, utc_now(), only=[queue_cfg])
            return LOOKED
        return _drain_worker(m)


def _destroying() -> Outcome:
    return Outcome(Kind.CANCELLED, DESTROYING, ("terminate",))


def _alive(row: InstanceDetails) -> bool:
    """Its worker has shown itself since the machine booted or resumed (a heartbeat, a
    sighting)."""
    seen = row.last_heartbeat_at
    since = row.resuming_at if row.state == S.RESUMING else row.booting_at
    return row.running_tasks > 0 or (seen is not None and since is not None and seen >= since)


def _cancel(session: Session, row: InstanceDetails, reason: str, now: datetime) -> Outcome:
    """An operator's drain of a machine that is not ready yet: cancel it (AGAIN when the row
    moved meanwhile)."""
    launch_id, queue = row.launch_id, row.queue
    action = "cancelled"
    if row.state == S.PENDING:
        why = f"{CANCELLED} ({reason}): it was not rented yet; nothing will be"
        if not moves.move(session, launch_id, S.PENDING, S.FAILED, now, why):
            return AGAIN
        outcome = Outcome(Kind.CANCELLED, "cancelled: it was not rented yet, and nothing will be")
    elif row.state == S.CREATING:
        if not moves.request_cancel(session, launch_id, now):
            return AGAIN
        why = (
            f"{CANCELLED} ({reason}): its create is in flight; the machine is destroyed "
            "as soon as the provider answers (or found by its label if the answer is lost)"
        )
        outcome = Outcome(
            Kind.CANCELLED,
            "cancelling: its create is in flight; the machine is destroyed as soon as it exists",
        )
        action = "cancelling"
    elif _alive(row):  # booting in the row, but its worker is up: ready, then drained warm
        # not judged for a slow host: its ready time here is the drain's, not its worker's
        # first sign of life (which came earlier, through a heartbeat or a sighting)
        why = "its worker is up"
        machines.mark_ready(session, launch_id, queue, row.provider, now, why, judge=False)
        return AGAIN
    else:
        why = f"{CANCELLED} ({reason}): no worker was up on it yet; destroyed now"
        if not moves.move(session, launch_id, row.state, S.TERMINATING, now, why):
            return AGAIN
        outcome = _destroying()
    events.record(
        session, [events.event("drain", action, why, queue=queue, launch_id=launch_id)], now
    )
    return outcome


def _drain_worker(m: StepRead) -> Outcome:
    """The drain of a worker that remote control reaches (or of a machine with none)."""
    launch_id, queue, worker = m.launch_id, m.queue, m.row.worker_name
    queue_cfg = m.queue_cfg
    probe = m.rt.worker_probe(queue_cfg.metrics) if queue_cfg is not None else None
    if worker and probe is not None:
        broker_queue = (queue_cfg.metrics.queue if queue_cfg else None) or queue
        try:
            probe.cancel_consumer(worker, broker_queue)
            state = probe.worker_state(worker)
        except SourceError as exc:
            log.warning("drain %s: %s", launch_id, exc)
            return waiting(f"broker unreachable ({exc})")
        if state is None:
            return waiting("the worker did not answer")
        consumed, busy = state
        if broker_queue in consumed:
            return waiting("the worker still consumes the queue")
        if busy:
            with m.rt.transaction() as session:
                heartbeats.note_busy(session, launch_id, busy, store_now(session))
            return waiting(f"{busy} task(s) still running, reserved or scheduled")
        try:
            probe.shutdown(worker)
        except SourceError as exc:
            log.warning("drain %s: shutdown not sent: %s", launch_id, exc)
        return _drained(m, "its worker stopped taking jobs and is idle")
    if worker and m.row.last_heartbeat_at is not None and probe is None:
        return waiting("the agent drains its worker and reports drained")
    return _drained(m, "no worker to drain")


def _drained(m: StepRead, why: str) -> Outcome:
    now = utc_now()
    with m.rt.transaction() as session:
        then = machines.finish_drain(session, m.launch_id, m.queue, why, now)
    if then is None:
        return skipped("already drained")
    return done(STOPPING if then == "stop" else "drained", then)


def cancel_if_requested(session: Session, launch_id: str, now: datetime) -> bool:
    """booting -> terminating for a machine cancelled while its create was in flight (called
    in the same transaction as the move to booting, so no heartbeat can come between). True if
    it moved: the caller sends the destroy."""
    queue = instances.queue_of(session, launch_id)
    why = f"{CANCELLED}: its create returned after an operator drained it; destroyed now"
    moved = moves.move(
        session,
        launch_id,
        S.BOOTING,
        S.TERMINATING,
        now,
        why,
        only_if=moves.CANCEL_REQUESTED,
    )
    if moved:
        said = events.event("drain", "cancelled", why, queue=queue, launch_id=launch_id)
        events.record(session, [said], now)
    return moved


STEP = DrainStep()

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
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from autoscaler.control import machines
from autoscaler.control.observe import observe_celery_workers
from autoscaler.control.runtime import Loaded, Runtime, log, utc_now
from autoscaler.lifecycle import InstanceState
from autoscaler.metrics.base import SourceError
from autoscaler.store import events, heartbeats, instances, moves
from autoscaler.store.db import Session, store_now
from autoscaler.store.instances import InstanceDetails

S = InstanceState


def run_drain(
    rt: Runtime,
    launch_id: str,
    reason: str = "drain requested",
    enqueue: Callable[[str, str], None] | None = None,
) -> str:
    """One step of draining `launch_id` (idempotent); returns where it stands. Once drained
    (or cancelled with a machine to destroy), the terminate step is enqueued (reconcile
    enqueues it again if that is lost)."""
    outcome = _step(rt, launch_id, reason)
    if enqueue is not None and (outcome == "drained" or outcome.startswith(DESTROYING)):
        enqueue("terminate", launch_id)
    if enqueue is not None and outcome == STOPPING:
        enqueue("stop", launch_id)
    return outcome


DESTROYING = "cancelled: its machine is being destroyed"
STOPPING = "drained: its machine is being stopped for the warm pool"
_AGAIN = None  # the row moved under this step (its launch claimed it, its create returned)
CANCELLED = "cancelled before it was ready"
"""The reason every cancel of a machine not ready yet starts with."""


def _step(rt: Runtime, launch_id: str, reason: str) -> str:
    probed = False
    for _ in range(4):
        outcome, probe_first = _once(rt, launch_id, reason, probe=not probed)
        if probe_first:
            probed = True
            _look_for_its_worker(rt, launch_id)
            continue
        if outcome is not _AGAIN:
            return outcome
    return "waiting: the machine changed state while asked to drain; ask again"


def _look_for_its_worker(rt: Runtime, launch_id: str) -> None:
    """A booting machine whose worker Celery remote control could see: look once before
    cancelling it, so a worker already taking jobs is drained (warm), never destroyed."""
    with rt.transaction() as session:
        row = instances.get(session, launch_id)
        queue = row.queue if row is not None else None
        loaded = rt.load_for(session, row.config_version if row is not None else None)
    queue_cfg = loaded.config.queues.get(queue) if loaded and queue else None
    if loaded is not None and queue_cfg is not None:
        observe_celery_workers(rt, loaded, utc_now(), only=[queue_cfg])


def _once(rt: Runtime, launch_id: str, reason: str, probe: bool) -> tuple[str | None, bool]:
    """(outcome, False), or (None, False) to read the row again, or (None, True) to look for
    its worker through remote control first."""
    now = utc_now()
    with rt.transaction() as session:
        row = instances.get(session, launch_id)
        if row is None:
            return "no such machine", False
        loaded = rt.load_for(session, row.config_version)  # the config it was rented under
        if row.state in (S.PENDING, S.CREATING, S.BOOTING, S.RESUMING):
            queue_cfg = loaded.config.queues.get(row.queue) if loaded else None
            remote = queue_cfg is not None and rt.worker_probe(queue_cfg.metrics) is not None
            if row.state in (S.BOOTING, S.RESUMING) and probe and remote and not _alive(row):
                return None, True
            return _cancel(session, row, reason, now), False
        if row.state == S.STOPPED:  # an operator empties the warm pool: nothing runs on it
            why = f"{reason}: destroyed from the warm pool"
            if not moves.move(session, launch_id, S.STOPPED, S.TERMINATING, now, why):
                return _AGAIN, False
            event = events.warm_event("destroy", why, row.queue, launch_id)
            events.record(session, [event], now)
            return DESTROYING, False
        if row.state == S.READY:  # an operator's drain: the tick's drains arrive as DRAINING
            moves.move(session, launch_id, S.READY, S.DRAINING, now, reason, drain_requested=False)
            events.record(
                session,
                [events.event("drain", "start", reason, queue=row.queue, launch_id=launch_id)],
                now,
            )
        elif row.state in (S.DRAINED, S.TERMINATING, S.STOPPING, S.STOPPED):
            return f"already leaving: it is {row.state.value}", False
        elif row.state != S.DRAINING:
            return f"not draining ({row.state.value})", False
        queue, worker = row.queue, row.worker_name
        if row.agent_registered_at is not None:
            # its agent saw DRAINING in its heartbeat answer: it stops the worker (warm
            # shutdown, the running task finishes) and reports drained through the API
            return "waiting: the agent drains its worker and reports drained", False
        last_heartbeat_at = row.last_heartbeat_at
    return _drain_worker(rt, loaded, launch_id, queue, worker, last_heartbeat_at), False


def _alive(row: InstanceDetails) -> bool:
    """Its worker has shown itself since the machine booted or resumed (a heartbeat, a
    sighting)."""
    seen = row.last_heartbeat_at
    since = row.resuming_at if row.state == S.RESUMING else row.booting_at
    return row.running_tasks > 0 or (seen is not None and since is not None and seen >= since)


def _cancel(session: Session, row: InstanceDetails, reason: str, now: datetime) -> str | None:
    """An operator's drain of a machine that is not ready yet: cancel it. Returns the outcome,
    or None when the row moved meanwhile (read it again)."""
    launch_id, queue = row.launch_id, row.queue
    action = "cancelled"
    if row.state == S.PENDING:
        why = f"{CANCELLED} ({reason}): it was not rented yet; nothing will be"
        if not moves.move(session, launch_id, S.PENDING, S.FAILED, now, why):
            return _AGAIN
        outcome = "cancelled: it was not rented yet, and nothing will be"
    elif row.state == S.CREATING:
        if not moves.request_cancel(session, launch_id, now):
            return _AGAIN
        why = (
            f"{CANCELLED} ({reason}): its create is in flight; the machine is destroyed "
            "as soon as the provider answers (or found by its label if the answer is lost)"
        )
        outcome = (
            "cancelling: its create is in flight; the machine is destroyed as soon as it exists"
        )
        action = "cancelling"
    elif _alive(row):  # booting in the row, but its worker is up: ready, then drained warm
        # not judged for a slow host: its ready time here is the drain's, not its worker's
        # first sign of life (which came earlier, through a heartbeat or a sighting)
        why = "its worker is up"
        machines.mark_ready(session, launch_id, queue, row.provider, now, why, judge=False)
        return _AGAIN
    else:
        why = f"{CANCELLED} ({reason}): no worker was up on it yet; destroyed now"
        if not moves.move(session, launch_id, row.state, S.TERMINATING, now, why):
            return _AGAIN
        outcome = DESTROYING
    events.record(
        session, [events.event("drain", action, why, queue=queue, launch_id=launch_id)], now
    )
    return outcome


def _drain_worker(
    rt: Runtime,
    loaded: Loaded | None,
    launch_id: str,
    queue: str,
    worker: str | None,
    last_heartbeat_at: datetime | None,
) -> str:
    """The drain of a worker that remote control reaches (or of a machine with none)."""
    queue_cfg = loaded.config.queues.get(queue) if loaded else None
    probe = rt.worker_probe(queue_cfg.metrics) if queue_cfg is not None else None
    if worker and probe is not None:
        broker_queue = (queue_cfg.metrics.queue if queue_cfg else None) or queue
        try:
            probe.cancel_consumer(worker, broker_queue)
            state = probe.worker_state(worker)
        except SourceError as exc:
            log.warning("drain %s: %s", launch_id, exc)
            return f"waiting: broker unreachable ({exc})"
        if state is None:
            return "waiting: the worker did not answer"
        consumed, busy = state
        if broker_queue in consumed:
            return "waiting: the worker still consumes the queue"
        if busy:
            with rt.transaction() as session:
                heartbeats.note_busy(session, launch_id, busy, store_now(session))
            return f"waiting: {busy} task(s) still running, reserved or scheduled"
        try:
            probe.shutdown(worker)
        except SourceError as exc:
            log.warning("drain %s: shutdown not sent: %s", launch_id, exc)
        return _drained(rt, launch_id, queue, "its worker stopped taking jobs and is idle")
    if worker and last_heartbeat_at is not None and probe is None:
        return "waiting: the agent drains its worker and reports drained"
    return _drained(rt, launch_id, queue, "no worker to drain")


def _drained(rt: Runtime, launch_id: str, queue: str, why: str) -> str:
    now = utc_now()
    with rt.transaction() as session:
        step = machines.finish_drain(session, launch_id, queue, why, now)
    if step is None:
        return "already drained"
    return STOPPING if step == "stop" else "drained"


def cancel_if_requested(session: Session, launch_id: str, now: datetime) -> bool:
    """booting -> terminating for a machine cancelled while its create was in flight (called
    in the same transaction as the move to booting, so no heartbeat can come between). True if
    it moved: the caller enqueues the destroy."""
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

"""Drain: stop a worker taking jobs, wait until nothing runs, then hand its machine over to be
destroyed. A busy worker is never destroyed here: a job it took between the drain decision and
now keeps running, and the step is simply tried again later.

For a Celery worker (seen through the watched broker's remote control):
    cancel_consumer for its queue -> confirm it no longer consumes it -> nothing running or
    reserved -> drained (warm shutdown sent) -> terminating.
A machine whose worker cannot be reached by remote control (an agent's worker, reporting
through heartbeats) is drained by the agent, which reports it drained; a machine with no
worker at all (the mock provider) is drained at once.
"""

from __future__ import annotations

from collections.abc import Callable

from autoscaler.control.runtime import Runtime, log, utc_now
from autoscaler.lifecycle import InstanceState
from autoscaler.metrics.base import SourceError
from autoscaler.store import fleet

S = InstanceState


def run_drain(
    rt: Runtime,
    launch_id: str,
    reason: str = "drain requested",
    enqueue: Callable[[str, str], None] | None = None,
) -> str:
    """One step of draining `launch_id` (idempotent); returns where it stands. Once drained,
    the terminate step is enqueued (reconcile enqueues it again if that is lost)."""
    outcome = _step(rt, launch_id, reason)
    if outcome == "drained" and enqueue is not None:
        enqueue("terminate", launch_id)
    return outcome


def _step(rt: Runtime, launch_id: str, reason: str) -> str:
    now = utc_now()
    with rt.transaction() as session:
        loaded = rt.load(session)
        row = fleet.get(session, launch_id)
        if row is None:
            return "no such machine"
        if row.state == S.READY:  # an operator's drain: the tick's drains arrive as DRAINING
            fleet.move(session, launch_id, S.READY, S.DRAINING, now, reason, drain_requested=False)
            fleet.record_events(
                session,
                [fleet.event("drain", "start", reason, queue=row.queue, launch_id=launch_id)],
                now,
            )
        elif row.state != S.DRAINING:
            return f"not draining ({row.state.value})"
        queue, worker = row.queue, row.worker_name
        if row.agent_registered_at is not None:
            # its agent saw DRAINING in its heartbeat answer: it stops the worker (warm
            # shutdown, the running task finishes) and reports drained through the API
            return "waiting: the agent drains its worker and reports drained"
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
                fleet.note_busy(session, launch_id, busy, utc_now())
            return f"waiting: {busy} task(s) still running or reserved"
        try:
            probe.shutdown(worker)
        except SourceError as exc:
            log.warning("drain %s: shutdown not sent: %s", launch_id, exc)
        return _drained(rt, launch_id, queue, "its worker stopped taking jobs and is idle")
    if worker and row.last_heartbeat_at is not None and probe is None:
        return "waiting: the agent drains its worker and reports drained"
    return _drained(rt, launch_id, queue, "no worker to drain")


def _drained(rt: Runtime, launch_id: str, queue: str, why: str) -> str:
    now = utc_now()
    with rt.transaction() as session:
        moved = fleet.move(session, launch_id, S.DRAINING, S.DRAINED, now, why)
        if moved:
            fleet.move(session, launch_id, S.DRAINED, S.TERMINATING, now, f"drained: {why}")
            fleet.record_events(
                session,
                [fleet.event("drain", "drained", why, queue=queue, launch_id=launch_id)],
                now,
            )
    return "drained" if moved else "already drained"

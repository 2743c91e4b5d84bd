"""Hand a lost machine's jobs back to the broker, within seconds instead of kombu's hour.

Reconcile marks a machine whose provider says it no longer runs (gone, dead, stopped by the
provider — never one merely silent while its provider runs it) with `handback_due_at` = now +
`GRACE`, and sends this step. From then on the jobs its worker last said it held (its own
heartbeats: `instances.tasks`) go back:

- **Redis**: their entries in kombu's `unacked` hash are restored to their queues the way kombu
  restores them (`metrics.handback.restore_unacked`: the same list and priority step, the
  entry removed from `unacked` and `unacked_index` in the same MULTI, under kombu's own
  `unacked_mutex`): of two restorers — two reconcilers racing, or kombu's visibility timeout —
  exactly one pushes each message.
- **RabbitMQ**: the machine's connections are closed through the management API (found by its
  own broker user), and the broker requeues its unacknowledged messages at once.
- **Early acks** (Celery's default): a running job was acknowledged when it started; it is
  not in `unacked` and cannot come back. The event names those task ids as lost, and `status`
  counts them per queue.

A machine can only name ids: one another live machine says it holds is never handed back for
it. The step is idempotent (a restore finds nothing the second time); `handback_done_at` is
written by the one caller that finishes it, so its events are written once.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from autoscaler.access import broker_users, rabbit_users
from autoscaler.config.models import CelerySource
from autoscaler.control.runtime import Runtime, log
from autoscaler.metrics import handback as broker_handback
from autoscaler.metrics.redis_list import open_redis
from autoscaler.metrics.registry import redis_layout
from autoscaler.store import fleet
from autoscaler.store.db import store_now
from autoscaler.urls import transport

GRACE = timedelta(seconds=5)
"""After the provider says the machine no longer runs: its listing may lag its processes'
end by a moment (a destroy in progress), never by more."""


def run_handback(rt: Runtime, launch_id: str, later: Callable[[float], None] | None = None) -> str:
    """Hand back the jobs of one lost machine; `later(seconds)` sends this step again when it
    is not due yet (the task's countdown). Returns what happened."""
    with rt.transaction() as session:
        row = fleet.get(session, launch_id)
        if row is None or row.handback_due_at is None or row.handback_done_at is not None:
            return "nothing to hand back"
        now = store_now(session)
        if now < row.handback_due_at:
            wait = (row.handback_due_at - now).total_seconds()
            if later is not None:
                later(wait)
            return f"not due for {wait:.1f}s"
        tasks = [t for t in row.tasks or () if isinstance(t, str)]
        elsewhere = fleet.tasks_held_elsewhere(session, launch_id, tasks)
        queue, user, acks_late = row.queue, row.broker_user, row.acks_late
        loaded = rt.load_for(session, row.config_version)
    queue_cfg = loaded.config.queues.get(queue) if loaded else None
    source = queue_cfg.metrics if queue_cfg is not None else None
    ids = [t for t in tasks if t not in elsewhere]
    details: dict[str, Any] = {"tasks": ids}
    if elsewhere:
        details["held_elsewhere"] = sorted(elsewhere)
    try:
        what, lost = _give_back(rt, source, queue, ids, user, details)
    except Exception as exc:  # the broker down: reconcile sends the step again
        log.warning("%s: jobs not handed back yet (%s)", launch_id, type(exc).__name__)
        return f"not handed back yet: {type(exc).__name__}"
    if lost and acks_late is not False:
        lost = []  # acknowledged or finished: gone from unacked, not known to be lost
    details["lost"] = lost
    with rt.transaction() as session:
        now = store_now(session)
        if fleet.finish_handback(session, launch_id, now):
            events = [
                fleet.event(
                    fleet.HANDBACK_EVENT,
                    "restored",
                    what,
                    queue=queue,
                    launch_id=launch_id,
                    details=details,
                )
            ]
            if lost:
                events.append(
                    fleet.event(
                        fleet.HANDBACK_EVENT,
                        "lost",
                        f"{len(lost)} job(s) lost with the machine: its worker acknowledged them "
                        "when they started (early acks); set task_acks_late and "
                        "task_reject_on_worker_lost so they come back: " + ", ".join(lost[:20]),
                        queue=queue,
                        launch_id=launch_id,
                        details={"tasks": lost},
                    )
                )
            fleet.record_events(session, events, now)
    return what


def _give_back(
    rt: Runtime,
    source: Any,
    queue: str,
    ids: list[str],
    user: str | None,
    details: dict[str, Any],
) -> tuple[str, list[str]]:
    """Give the jobs back on the queue's broker; (what was done, ids not found held by it)."""
    url = broker_users.admin_url(source, rt.env) if isinstance(source, CelerySource) else None
    if url is None:
        return "no broker this step can reach for the queue: its jobs come back by the broker", []
    if transport(url) == "amqp":
        if not user:
            return "no broker user of its own: RabbitMQ requeues at the dead connection", []
        target = rabbit_users.plan(url, source.queue or queue, source.management_url)
        closed = rabbit_users.close_connections(target, user, "its machine is gone")
        details["connections_closed"] = closed
        return f"closed {closed} connection(s) of {user}: its unacknowledged jobs requeued", []
    if not ids:
        return "its worker held no job", []
    client = open_redis(url)
    try:
        done = broker_handback.restore_unacked(
            client, redis_layout(source), ids, queues=[source.queue or queue]
        )
    finally:
        client.close()
    details["restored"] = sorted(done.task_ids)
    if done.left:  # contention on the hash outlasted the step: still in unacked, never lost
        details["left_to_the_visibility_timeout"] = [e.task_id for e in done.left]
    if done.unroutable:
        details["unroutable"] = [e.task_id for e in done.unroutable]
    return (
        f"restored {len(done.task_ids)} of {len(ids)} job(s) to their queues",
        list(done.not_found),
    )

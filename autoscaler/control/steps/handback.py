"""Give a lost machine's jobs back where the broker itself can tell which jobs were its own.

Reconcile marks a machine whose provider says it no longer runs (gone, dead, stopped by the
provider — never one merely silent while its provider runs it) with `handback_due_at` = now +
`GRACE`, and sends this step. What a machine reports (the task ids of its heartbeats) moves
nothing: a machine can name any job, another machine's included. Only the broker's own record
of the machine's deliveries counts:

- **RabbitMQ**: a delivery belongs to the channel, and so to the connection and the broker user,
  that consumed it; a rented machine has a broker user of its own. The step closes that user's
  connections through the management API and the broker requeues exactly their unacknowledged
  deliveries, at once. No other consumer's delivery can be named into it.
- **Redis**: kombu's `unacked` hash records no consumer. Its field is the delivery tag the
  *publisher* chose (kept when a message is delivered again), its value the message, and its
  index score the consumer's clock; every machine of a trust domain may write all three (kombu's
  workers need HSET, ZADD and the mutex's SET). Nothing the broker keeps ties an entry to a
  machine, so the step restores nothing: the machine's jobs come back by kombu's own
  `visibility_timeout` (an hour by default; set it above your longest job), as they would
  without us. The event says so and how many jobs the machine said it held.
- **Early acks** (Celery's default): a running job was acknowledged when it started; no broker
  keeps a record of it. The event says the machine's worker claimed N such jobs; it counts one
  machine, never the ids it named (a machine could name 300 jobs that never existed).

`handback_done_at` is written by the one caller that finishes the step, so its events are
written once; closing a user's connections again is harmless.

`sweep_forged_mutexes` (each reconcile round) deletes a `unacked_mutex` on a watched Redis that
kombu cannot have set (no expiry, a longer one, no lock token: `brokers.redis.unacked_mutex`): a
machine that sets one would otherwise stop every consumer's restore in its domain, for as long
as the key lives.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from autoscaler.brokers import users as broker_users
from autoscaler.brokers.base import MetricsConfigError, source_url
from autoscaler.brokers.rabbitmq import users as rabbit_users
from autoscaler.brokers.redis.keys import redis_layout
from autoscaler.brokers.redis.unacked_mutex import clear_forged
from autoscaler.brokers.redis_client import open_redis
from autoscaler.config.metrics_sources import CelerySource
from autoscaler.control.runtime import Runtime, log
from autoscaler.control.steps.frame import Kind, Outcome, Step, StepRead, done, skipped
from autoscaler.store import events, handbacks
from autoscaler.store.db import Session, store_now
from autoscaler.store.instances import InstanceDetails
from autoscaler.urls import transport

GRACE = timedelta(seconds=5)
"""After the provider says the machine no longer runs: its listing may lag its processes'
end by a moment (a destroy in progress), never by more."""

NAMED_SHOWN = 20
"""Task ids of the machine's own claim shown in an event (its word, for the operator only)."""


class HandbackStep(Step[None]):
    """Give back the jobs of one lost machine; not due yet, the step is sent again when it is
    (the task's countdown)."""

    name = "handback"

    def check(self, session: Session, row: InstanceDetails | None) -> Outcome | None:
        if row is None or row.handback_due_at is None or row.handback_done_at is not None:
            return skipped("nothing to hand back")
        now = store_now(session)
        if now < row.handback_due_at:
            wait = (row.handback_due_at - now).total_seconds()
            return Outcome(Kind.WAITING, f"not due for {wait:.1f}s", again_in=wait)
        return None

    def read(self, session: Session, m: StepRead) -> None:
        return None

    def act(self, m: StepRead, kept: None) -> Outcome:
        launch_id, queue = m.launch_id, m.queue
        said = [t for t in m.row.tasks or () if isinstance(t, str)]
        queue_cfg = m.queue_cfg
        source = queue_cfg.metrics if queue_cfg is not None else None
        details: dict[str, Any] = {"said_held": len(said)}
        try:
            what, action = _give_back(m.rt, source, queue, said, m.row.broker_user, details)
        except Exception as exc:  # the broker down: reconcile sends the step again
            log.warning("%s: jobs not handed back yet (%s)", launch_id, type(exc).__name__)
            return Outcome(Kind.WAITING, f"not handed back yet: {type(exc).__name__}")
        early = bool(said) and m.row.acks_late is False
        with m.rt.transaction() as session:
            now = store_now(session)
            if handbacks.finish(session, launch_id, now):
                audit = [
                    events.event(
                        events.HANDBACK_EVENT, action, what, queue=queue, launch_id=launch_id,
                        details=details,
                    )
                ]  # fmt: skip
                if early:
                    audit.append(
                        events.event(
                            events.HANDBACK_EVENT,
                            "lost",
                            f"its worker said it was running {len(said)} job(s) acknowledged "
                            "when they started (early acks): no broker keeps a record of them, "
                            "so none can come back; set task_acks_late and "
                            "task_reject_on_worker_lost so they do (named by the machine: "
                            + ", ".join(said[:NAMED_SHOWN])
                            + ")",
                            queue=queue,
                            launch_id=launch_id,
                            details={"said": said[:NAMED_SHOWN], "said_count": len(said)},
                        )
                    )
                events.record(session, audit, now)
        return done(what)


def _give_back(
    rt: Runtime,
    source: Any,
    queue: str,
    said: list[str],
    user: str | None,
    details: dict[str, Any],
) -> tuple[str, str]:
    """Give the jobs back on the queue's broker where it can tell which were the machine's;
    (what was done, the event's action: `requeued` or `left`)."""
    url = broker_users.admin_url(source, rt.env) if isinstance(source, CelerySource) else None
    if url is None:
        return "no broker this step can reach for the queue: its jobs come back by the broker", (
            "left"
        )
    if transport(url) == "amqp":
        if not user:
            return "no broker user of its own: RabbitMQ requeues at the dead connection", "left"
        target = rabbit_users.plan(url, source.queue or queue, source.management_url)
        closed = rabbit_users.close_connections(target, user, "its machine is gone")
        details["connections_closed"] = closed
        return (
            f"closed {closed} connection(s) of {user}: RabbitMQ requeued their unacknowledged jobs",
            "requeued",
        )
    details["left_to_the_visibility_timeout"] = True
    return (
        f"its worker said it held {len(said)} job(s); on Redis kombu's unacked hash does not "
        "record which worker holds a job, so they come back by kombu's visibility_timeout "
        "(an hour by default), not by a machine's word",
        "left",
    )


def sweep_forged_mutexes(rt: Runtime) -> list[str]:
    """Delete the forged `unacked_mutex` of every watched Redis domain of the newest config
    (one PTTL and GET per domain and round); an event names each. Returns the events' texts."""
    with rt.transaction() as session:
        loaded = rt.load(session)
    if loaded is None:
        return []
    domains: dict[tuple[str, str], tuple[str, Any]] = {}
    for name, queue_cfg in sorted(loaded.config.queues.items()):
        source = queue_cfg.metrics
        if not isinstance(source, CelerySource):
            continue
        try:
            url = source_url(source, rt.env)
        except MetricsConfigError:
            continue
        if transport(url) == "redis":
            domains.setdefault((url, source.global_keyprefix), (name, source))
    found: list[str] = []
    for (url, prefix), (queue, source) in domains.items():
        try:
            client = open_redis(url)
            try:
                why = clear_forged(client, redis_layout(source))
            finally:
                client.close()
        except Exception as exc:  # the broker down: the next round looks again
            log.warning("unacked mutex of %r not checked (%s)", prefix, type(exc).__name__)
            continue
        if why is not None:
            text = (
                f"deleted {prefix}unacked_mutex on the watched broker: {why}, so kombu did not "
                "set it (a machine of this trust domain may have, to stop its restores)"
            )
            found.append(text)
            with rt.transaction() as session:
                event = events.event(events.HANDBACK_EVENT, "forged_mutex", text, queue=queue)
                events.record(session, [event], store_now(session))
    return found


STEP = HandbackStep()

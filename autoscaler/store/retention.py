"""Retention: no table grows for ever. One table of (table, time column, how long kept), swept
on a schedule (`autoscaler.retention`, beat, every `EVERY`).

Before this, `tick_slots` was never pruned (about 2.9 M rows a day at 1,000 queues, on the
table every tick upserts into), expired rate limits and avoided hosts were never removed, and
the audit trail and closed machines were kept for ever. The tables that already forget as they
are written (finished jobs, chart samples, boot phases, report budgets, worker sightings) keep
their own rule and are named in `SELF_PRUNED`; the tables a human grows (config versions, keys,
providers) or that hold one row per configured thing are named in `BOUNDED`. A table in none
of the three fails `tests/store/test_retention.py`, so a new table must say how it stays small.

Never deleted: a machine that may still exist (`LIVE_STATES`), a hold or an avoided host
still in force. Each rule is one DELETE in its own transaction (short locks; a sweep that dies
half-way leaves the rest to the next), on an indexed time column - or, for a table of a
machine's details (`instance_transitions`), on its indexed launch id: gone with its machine's row.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, delete, exists
from sqlalchemy.orm import Session

from autoscaler.lifecycle import LIVE_STATES
from autoscaler.store.models import (
    AvoidedHost,
    Instance,
    InstanceTransition,
    MockMachine,
    ProviderRateLimit,
    ScaleEvent,
    TickSlot,
)

EVERY = timedelta(minutes=10)
"""How often beat sends the sweep."""


@dataclass(frozen=True)
class Rule:
    """Rows of `table` are forgotten once `expired(now)` holds for them."""

    table: str
    keep: timedelta
    expired: Callable[[datetime], ColumnElement[bool]]
    why: str


RULES: tuple[Rule, ...] = (
    Rule(
        "tick_slots",
        timedelta(hours=1),
        lambda cutoff: TickSlot.claimed_at < cutoff,
        "a slot only guards against a duplicate of a recent tick",
    ),
    Rule(
        "scale_events",
        timedelta(days=90),
        lambda cutoff: ScaleEvent.at < cutoff,
        "the audit trail: `events --since` and the dashboard read the last 90 days",
    ),
    Rule(
        "instances",
        timedelta(days=90),
        lambda cutoff: Instance.state.not_in(LIVE_STATES) & (Instance.updated_at < cutoff),
        "a closed machine's row (its bill, its history); a live one is never forgotten",
    ),
    Rule(
        "instance_transitions",
        timedelta(0),
        lambda cutoff: ~exists().where(Instance.launch_id == InstanceTransition.launch_id),
        "a machine's state history, kept as long as its instance row (swept after `instances`)",
    ),
    Rule(
        "provider_rate_limits",
        timedelta(0),
        lambda cutoff: ProviderRateLimit.until <= cutoff,
        "a hold that has ended",
    ),
    Rule(
        "avoided_hosts",
        timedelta(0),
        lambda cutoff: AvoidedHost.until <= cutoff,
        "an avoidance that has ended",
    ),
    Rule(
        "mock_machines",
        timedelta(days=1),
        lambda cutoff: MockMachine.destroyed_at < cutoff,
        "a mock machine destroyed a day ago (the mock answers 'gone' either way)",
    ),
)

_MODELS = {
    "tick_slots": TickSlot,
    "scale_events": ScaleEvent,
    "instances": Instance,
    "instance_transitions": InstanceTransition,
    "provider_rate_limits": ProviderRateLimit,
    "avoided_hosts": AvoidedHost,
    "mock_machines": MockMachine,
}

SELF_PRUNED = {
    "job_records": "store/job_records.py: finished jobs older than 14 days, as reports arrive",
    "queue_samples": "store/queue_samples.py: older than 7 days, as samples are written",
    "boot_phases": "store/boot_phases.py: machines booted over 30 days ago, as phases arrive",
    "report_budgets": "store/report_budgets.py: a reporter silent for a day",
    "worker_sightings": "store/worker_sightings.py: sightings older than the silence window",
    "orphan_sightings": "store/orphan_sightings.py: rewritten whole each reconcile round",
    "queue_head_sightings": "store/head_sightings.py: replaced per source and queue",
    "manual_targets": "store/manual_targets.py: expired targets removed when targets are read",
    "rental_backoffs": "one row per (queue, provider), cleared on a successful rental",
}

BOUNDED = {
    "installation": "one row",
    "providers": "one row per registered provider (an operator's command)",
    "config_versions": "one row per applied config (an operator's command)",
    "api_keys": "one row per admin or enrolment key (an operator's command)",
    "leases": "one row per named lease (a round, a queue's evaluation)",
    "queue_status": "one row per queue",
    "metric_readings": "one row per (source, queue)",
}


def sweep(
    transaction: Callable[[], AbstractContextManager[Session]],
    now: datetime,
    rules: tuple[Rule, ...] = RULES,
) -> dict[str, int]:
    """Apply every rule at `now`, each in its own transaction; rows deleted per table."""
    deleted: dict[str, int] = {}
    for rule in rules:
        with transaction() as session:
            deleted[rule.table] = forget(session, rule, now)
    return deleted


def forget(session: Session, rule: Rule, now: datetime) -> int:
    """One rule's DELETE; how many rows it removed."""
    model = _MODELS[rule.table]
    result = session.execute(delete(model).where(rule.expired(now - rule.keep)))
    return int(getattr(result, "rowcount", 0) or 0)

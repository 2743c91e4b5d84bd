"""The hedged launch: one more machine when every booting machine of a queue is late (see
HEDGE_LATE_FACTOR), and how long before scheduled jobs fall due a machine is asked for."""

from __future__ import annotations

from datetime import datetime

from autoscaler.config.models import QueueSettings
from autoscaler.lifecycle import InstanceState
from autoscaler.policy import triggers as t
from autoscaler.policy.snapshot import QueueSnapshot

HEDGE_MIN_LATE_S = 60.0
"""A booting machine is never judged late before this (see HEDGE_LATE_FACTOR)."""

HEDGE_LATE_FACTOR = 1.5
"""Hedged launch: jobs wait, nothing serves, and every booting machine of the queue has booted
longer than this × the boot estimate (the queue's recent boots, else the slowest ready machine
of the queue, else DEFAULT_BOOT_ESTIMATE; below the boot timeout): one more machine is rented, a
bounded exception to no stacking (the new one is not late, so at most one per late period). A
failed boot then costs a late boot, not the boot timeout: sparse p95 1106 s → 628 s, trickle p99
948 s → 629 s, diurnal max 1121 s → 727 s, cost within ±2 % (`benchmarks/cost.py --unseen`)."""


def late_boot_s(settings: QueueSettings, qs: QueueSnapshot) -> float:
    """After how long a booting machine of the queue counts as late (see HEDGE_LATE_FACTOR)."""
    timeout = settings.boot_timeout
    estimate = qs.boot_estimate
    if estimate is None:
        boots = [
            (m.ready_at - m.created_at).total_seconds()
            for m in qs.machines
            if m.ready_at is not None and m.ready_at >= m.created_at
        ]
        estimate = max(boots) if boots else t.DEFAULT_BOOT_ESTIMATE
    poll = settings.poll_interval
    # Never late before a minute, nor before two polls past the estimate: a worker seen only
    # through remote control is seen ready at a reconcile, so its quick boot looks a poll or
    # two longer than it is (an agent's machine is ready at its first heartbeat).
    late = max(HEDGE_LATE_FACTOR * max(0.0, estimate), estimate + 2 * poll, HEDGE_MIN_LATE_S)
    return min(late, timeout)


def hedge_reason(settings: QueueSettings, qs: QueueSnapshot, now: datetime) -> str | None:
    """Why to rent one more machine while others boot, or None (see HEDGE_LATE_FACTOR)."""
    m = qs.metrics
    if m is None or m.stale or m.pending <= 0 or m.paused or qs.manual_workers > 0:
        return None
    if any(x.serving for x in qs.machines):
        return None
    booting = [x for x in qs.machines if x.booting]
    if not booting:
        return None
    if any(x.state == InstanceState.RESUMING for x in booting):
        # a resume is judged by its own resume_timeout (a warm miss rents at once); measured
        # from its first rental it would look hours late and rent a second machine each time
        # (spiky day, a pool of 16 kept 4h: 106 of 323 resumes; benchmarks/warm_pool_sim.py)
        return None
    late = late_boot_s(settings, qs)
    if late >= settings.boot_timeout:
        return None  # the boot timeout comes first
    oldest = min((now - x.created_at).total_seconds() for x in booting)
    if oldest <= late:
        return None
    return (
        f"hedge: {m.pending} pending, nothing serving, and all {len(booting)} booting machine(s) "
        f"past {late:.0f}s (the youngest {oldest:.0f}s) → one more machine"
    )


def lead(settings: QueueSettings, qs: QueueSnapshot) -> float:
    """How long before scheduled jobs fall due a machine is asked for: the queue's recent boot
    time, else `DEFAULT_BOOT_ESTIMATE`; never more than the boot timeout."""
    timeout = settings.boot_timeout
    estimate = qs.boot_estimate if qs.boot_estimate is not None else t.DEFAULT_BOOT_ESTIMATE
    return min(max(0.0, estimate), timeout)

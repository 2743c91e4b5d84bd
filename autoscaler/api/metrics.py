"""`/metrics`: the autoscaler's own numbers in Prometheus' text format, read from the store on
each scrape (a fresh registry per scrape, so every API process answers the same).

Per queue: pending jobs and the oldest one's age (the last good reading), machines by state,
desired machines (the latest evaluation), launches and launch failures (from the audit trail),
the spend rate (Σ price of every machine that may still bill; a stopped one at its storage
price), and its warm pool: the size the config allows, stopped machines, what they bill, warm
hits and misses (from the audit trail); machines preempted per host, jobs of lost machines
handed back and jobs lost with them. Per (provider, GPU): median and p90 boot seconds of the
last 7 days' cold boots and how many (launch decision to ready, the control plane's own times).
Nothing secret: queue names, states and numbers only.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from autoscaler.lifecycle import InstanceState
from autoscaler.policy.billing import Charge, committed
from autoscaler.store import event_views, instances, metric_readings, queue_status, warm_pool_views
from autoscaler.store.boots import boot_times
from autoscaler.store.db import Session, store_now

EVER = datetime(1970, 1, 1, tzinfo=UTC)
"""Counters count over every event kept."""


def render(session: Session, rt: Any = None) -> str:
    reg = CollectorRegistry()
    pending = Gauge(
        "autoscaler_queue_pending", "Jobs waiting (last good reading)", ["queue"], registry=reg
    )
    oldest = Gauge(
        "autoscaler_queue_oldest_pending_age_seconds",
        "Age of the oldest waiting job (last good reading)",
        ["queue"],
        registry=reg,
    )
    stale = Gauge(
        "autoscaler_queue_reading_stale",
        "1 when the last reading is stale",
        ["queue"],
        registry=reg,
    )
    workers = Gauge(
        "autoscaler_workers", "Machines by lifecycle state", ["queue", "state"], registry=reg
    )
    desired = Gauge(
        "autoscaler_queue_desired_workers",
        "Machines the latest evaluation wants",
        ["queue"],
        registry=reg,
    )
    launches = Gauge(
        "autoscaler_launches_total", "Machines rented (audit trail)", ["queue"], registry=reg
    )
    failures = Gauge(
        "autoscaler_launch_failures_total",
        "Launches that failed (audit trail)",
        ["queue"],
        registry=reg,
    )
    spend = Gauge(
        "autoscaler_spend_rate_dollars_per_hour",
        "Σ price per hour of every machine that may still bill",
        ["queue"],
        registry=reg,
    )
    pool_size = Gauge(
        "autoscaler_warm_pool_size",
        "Stopped machines the queue's warm pool may keep (newest config)",
        ["queue"],
        registry=reg,
    )
    pool_stopped = Gauge(
        "autoscaler_warm_pool_stopped",
        "Stopped machines kept in the queue's warm pool",
        ["queue"],
        registry=reg,
    )
    pool_storage = Gauge(
        "autoscaler_warm_pool_storage_dollars_per_hour",
        "Σ storage price per hour of the queue's stopped machines",
        ["queue"],
        registry=reg,
    )
    hits = Gauge(
        "autoscaler_warm_hits_total",
        "Resumed machines whose worker became ready (audit trail)",
        ["queue"],
        registry=reg,
    )
    misses = Gauge(
        "autoscaler_warm_misses_total",
        "Resumes that failed: destroyed, a fresh machine rented (audit trail)",
        ["queue"],
        registry=reg,
    )
    boot = Gauge(
        "autoscaler_boot_seconds",
        "Launch decision to ready of the last 7 days' cold boots (control plane's clock): "
        "median (quantile 0.5) and p90 (0.9)",
        ["provider", "gpu", "quantile"],
        registry=reg,
    )
    boots = Gauge(
        "autoscaler_boot_samples",
        "Cold boots of the last 7 days behind autoscaler_boot_seconds",
        ["provider", "gpu"],
        registry=reg,
    )
    preempted = Gauge(
        "autoscaler_preemptions_total",
        "Interruptible machines stopped by their provider (outbid), per host (audit trail)",
        ["queue", "provider", "host"],
        registry=reg,
    )
    lost_jobs = Gauge(
        "autoscaler_early_ack_losses_total",
        "Lost machines whose workers said they ran early-acked jobs (gone with them)",
        ["queue"],
        registry=reg,
    )
    handed_back = Gauge(
        "autoscaler_requeued_machines_total",
        "Lost machines whose unacknowledged jobs their broker requeued at once (audit trail)",
        ["queue"],
        registry=reg,
    )
    for queue, reading in metric_readings.every(session):
        data = reading if isinstance(reading, dict) else {}
        pending.labels(queue).set(float(data.get("pending") or 0))
        age = data.get("oldest_pending_age")
        oldest.labels(queue).set(float(age) if isinstance(age, int | float) else 0.0)
        stale.labels(queue).set(1.0 if data.get("stale") else 0.0)
    for queue, evaluation in queue_status.evaluations(session).items():
        status = evaluation.status
        value = (status or {}).get("desired") if isinstance(status, dict) else None
        if isinstance(value, int | float):
            desired.labels(queue).set(float(value))
    counts: dict[tuple[str, str], int] = {}
    rates: dict[str, float] = {}
    storage: dict[str, float] = {}
    for row in instances.live_rows(session):
        key = (row.queue, row.state.value)
        counts[key] = counts.get(key, 0) + 1
        if committed(row.state) is Charge.STORAGE:  # its kept disk only (0 when unknown)
            price = row.storage_price_per_hour or 0.0
            storage[row.queue] = storage.get(row.queue, 0.0) + price
        else:
            price = row.price_per_hour or 0.0
        rates[row.queue] = rates.get(row.queue, 0.0) + price
    for (queue, state), n in counts.items():
        workers.labels(queue, state).set(n)
    for queue, rate in rates.items():
        spend.labels(queue).set(rate)
    for (queue, action), n in event_views.launch_counts(session).items():
        (launches if action == "created" else failures).labels(queue).set(n)
    pools = warm_pool_views.warm_pools(session)
    for queue, pool in pools.items():
        pool_size.labels(queue).set(pool.size)
    for queue in set(pools) | {q for q, state in counts if state == InstanceState.STOPPED}:
        pool_stopped.labels(queue).set(counts.get((queue, InstanceState.STOPPED.value), 0))
        pool_storage.labels(queue).set(storage.get(queue, 0.0))
    for (queue, action), n in warm_pool_views.warm_counts(session).items():
        if action in ("hit", "miss"):
            (hits if action == "hit" else misses).labels(queue).set(n)
    for (queue, provider, host), n in event_views.preempting_hosts(session, EVER).items():
        preempted.labels(queue, provider, host).set(n)
    for queue, (_, lost, back) in event_views.lost_work(session, EVER).items():
        lost_jobs.labels(queue).set(lost)
        handed_back.labels(queue).set(back)
    for b in boot_times(session, store_now(session)):
        boot.labels(b.provider, b.gpu, "0.5").set(b.median_seconds)
        boot.labels(b.provider, b.gpu, "0.9").set(b.p90_seconds)
        boots.labels(b.provider, b.gpu).set(b.samples)
    return generate_latest(reg).decode()

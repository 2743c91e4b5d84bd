"""What decide() sees: the snapshot built from the store's rows, the metrics just read, the
sightings within the trust scope, and each queue's kept history."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from autoscaler.brokers.base import source_url
from autoscaler.brokers.registry import broker_domain
from autoscaler.brokers.users import user_broker
from autoscaler.brokers.workers import QueueLoad, with_worker_loads
from autoscaler.config.triggers import MIN_GAPS
from autoscaler.control.observe import Scope, read_sightings
from autoscaler.control.runtime import Loaded, Runtime
from autoscaler.lifecycle import InstanceState
from autoscaler.policy.history import GAPS_KEPT, NO_HISTORY, QueueHistory, observe_load
from autoscaler.policy.snapshot import QueueMetrics, QueueSnapshot, Snapshot
from autoscaler.store import (
    backoffs,
    boots,
    instances,
    job_records,
    manual_targets,
    queue_status,
    rate_limits,
)
from autoscaler.store.db import Session
from autoscaler.store.worker_sightings import ENROLLED_DOMAIN

HAND_MADE_WINDOW_POLLS = 3
"""A hand-made worker counts as capacity until it has not answered for this many polls."""


def build_snapshot(
    session: Session,
    rt: Runtime,
    loaded: Loaded,
    metrics: Mapping[str, QueueMetrics],
    now: datetime,
    held: Collection[str] | None = None,
) -> Snapshot:
    """Every queue's numbers, our machines, hand-made workers, backoffs and manual targets:
    one query per table whatever the number of queues and machines. With `held` (one shard's
    queues), only those queues and their machines are listed; every other machine of the
    account is counted for the caps (`Snapshot.elsewhere`, one more query where caps are set).

    The broker's numbers are completed with what the workers reported through the worker-status
    port (running, prefetched and ETA-held jobs per queue: `with_worker_loads`); a machine of
    ours reporting through agent heartbeats only adds its running tasks. Queues with jobs waiting
    or scheduled and no machine serving get their recent boot time (one more query, only then)."""
    rows = instances.live_rows(session, held)
    elsewhere = (
        instances.billing_elsewhere(session, held) if held is not None and capped(loaded) else ()
    )
    machines = instances.machines_by_queue(rows)
    held_back = backoffs.by_queue(session)
    targets = manual_targets.in_force(session, now)
    ours = {r.host_id or "" for r in rows} | {
        (r.worker_name or "").rsplit("@", 1)[-1].lower() for r in rows
    }
    window = HAND_MADE_WINDOW_POLLS * loaded.config.poll_interval
    scope = sighting_scope(loaded, rt.settings.api_url_set, rt.env)
    hand_made, loads, reported = read_sightings(
        session, rt.installation_id(session), ours, now, window, scope
    )
    since = now - timedelta(seconds=window)
    for r in rows:  # agent heartbeats: running tasks of machines no sighting reported
        if (
            r.state in (InstanceState.READY, InstanceState.DRAINING)
            and r.last_heartbeat_at is not None
            and r.last_heartbeat_at >= since
            and (r.worker_name or "") not in reported
        ):
            loads[r.queue] = loads.get(r.queue, QueueLoad()) + QueueLoad(running=r.running_tasks)
    completed = {name: with_worker_loads(m, loads.get(name)) for name, m in metrics.items()}
    names = (set(loaded.config.queues) if held is None else set(held)) | set(machines)
    histories = _histories(session, completed, names, now)
    # the recent boot time matters where jobs wait or are scheduled (pre-warm, a late boot, the
    # burst rule) and where an idle machine may go at a learned timeout (a boot is its price)
    estimates = boots.boot_estimates(
        session,
        [
            name
            for name, m in completed.items()
            if m.scheduled > 0
            or m.pending > 0
            or (
                len(histories[name].quiet_gaps) >= MIN_GAPS
                and any(x.serving and not x.busy for x in machines.get(name, ()))
            )
        ],
        now,
    )
    queues = []
    for name in sorted(names):
        queues.append(
            QueueSnapshot(
                name=name,
                metrics=completed.get(name),
                machines=machines.get(name, ()),
                manual_workers=len(hand_made.get(name, ())),
                backoffs=held_back.get(name, ()),
                manual_target=targets.get(name),
                boot_estimate=estimates.get(name),
                history=histories[name],
            )
        )
    return Snapshot(
        tuple(queues), rate_limits=rate_limits.active(session, now), elsewhere=elsewhere
    )


def sighting_scope(loaded: Loaded, users_made: bool, env: Mapping[str, str]) -> Scope:
    """The queues each sighting counts for (`observe.read_sightings`).

    A broker sighting counts for the queues of the domain it was heard through whose broker
    queue it names: a reply through queue A's broker claiming queue B is nobody's capacity. An
    enrolled machine's counts for the queues it names (its key was checked against them). A
    broker-seen hand-made worker counts only where `Autoscale.hand_made` allows: `broker`, or
    `auto` unless rented machines get broker users of their own there (a watched Redis with
    AUTOSCALER_API_URL set: any of them could answer remote control as anyone)."""
    heard: dict[tuple[str, str], list[str]] = defaultdict(list)
    enrolled: dict[str, list[str]] = defaultdict(list)
    trusted: set[str] = set()
    for name, q in loaded.config.queues.items():
        bq = q.metrics.queue or name
        heard[(broker_domain(q.metrics, env), bq)].append(name)
        enrolled[bq].append(name)
        mode = q.autoscale.hand_made if q.autoscale is not None else "auto"
        if mode == "auto":
            try:
                redis = user_broker(source_url(q.metrics, env)) == "redis"
            except ValueError:
                redis = False
            own_users = users_made and q.metrics.source == "celery" and redis
            if not own_users:
                trusted.add(name)
        elif mode == "broker":
            trusted.add(name)

    def scope(domain: str, queue: str, broker_seen: bool) -> Iterable[str]:
        names = enrolled[queue] if domain == ENROLLED_DOMAIN else heard[(domain, queue)]
        return [n for n in names if n in trusted] if broker_seen else names

    return scope


def _histories(
    session: Session, metrics: Mapping[str, QueueMetrics], names: Collection[str], now: datetime
) -> dict[str, QueueHistory]:
    """Each queue's history (`policy.history`) as stored by the last evaluation, moved on by
    this reading (a stale or missing one teaches nothing), with — where jobs wait — the mean
    runtime of its jobs finished in the last day (`store.job_records`). Two queries whatever
    the number of queues."""
    stored = {q: _history_from_json(h) for q, h in queue_status.histories(session, names).items()}
    # the mean runtime serves the burst rule only, which acts only while jobs wait
    waiting = [n for n in names if (m := metrics.get(n)) is not None and m.pending > 0]
    stats = job_records.runtime_stats(session, waiting, now)
    out = {}
    for name in names:
        h = stored.get(name) or NO_HISTORY
        m = metrics.get(name)
        if m is not None and not m.stale:
            h = observe_load(h, m.pending + m.started_or_held, m.read_at)
        st = stats.get(name)
        out[name] = replace(
            h, job_seconds=st.mean_s if st else None, jobs_seen=st.jobs if st else 0
        )
    return out


def history_json(h: QueueHistory) -> dict[str, Any]:
    """What `queue_status.history` keeps of a history (the runtimes live in job_records)."""
    return {
        "gaps": [round(g, 3) for g in h.quiet_gaps],
        "quiet_since": h.quiet_since.isoformat() if h.quiet_since else None,
    }


def _history_from_json(doc: object) -> QueueHistory:
    """A stored history; anything unreadable is an empty one (it is only a hint)."""
    if not isinstance(doc, dict):
        return NO_HISTORY
    gaps = doc.get("gaps")
    since = doc.get("quiet_since")
    try:
        quiet_since = datetime.fromisoformat(since) if isinstance(since, str) else None
    except ValueError:
        quiet_since = None
    return QueueHistory(
        quiet_gaps=tuple(
            float(g)
            for g in (gaps if isinstance(gaps, list) else [])
            if isinstance(g, int | float) and not isinstance(g, bool) and g >= 0
        )[-GAPS_KEPT:],
        quiet_since=quiet_since,
    )


def capped(loaded: Loaded) -> bool:
    """The account has a machine or price cap: shards must count each other's machines."""
    limits = loaded.config.limits
    return limits.max_machines is not None or limits.max_price_per_hour is not None

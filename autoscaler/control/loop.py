"""The evaluation tick, top to bottom (arq's worker loop is the model):

    claim the queues' slots -> take the evaluation lease -> read every source once ->
    build the snapshot from the store -> decide() -> record intents, drain marks, waits and
    events in one transaction -> enqueue the launches and drains.

A crash anywhere leaves the store consistent: intents are rows before any provider call, a
lost enqueue is redone by reconcile (an intent nobody claimed), and an unreleased lease expires.
Two beats, a redelivered tick or the fast path racing the poll tick cannot launch twice: the
lease lets one evaluation run at a time and every later one sees the earlier intents as
machines on their way (no stacking).

With `evaluation.shards: n` (PostgreSQL) the poll tick sends n shard ticks instead, each
evaluating the queues `policy.shards` gives it under a lease of its own: n workers evaluate at
once, a queue is only ever in one shard, and a lease is refused while an evaluation splitting
the queues another way is live. A shard lists its own queues' machines and counts everyone
else's (`Snapshot.elsewhere`) for the account-wide caps; where caps are set and its plan
launches or resumes, it writes behind a savepoint, then takes the account lock (held to its
commit) and counts the others again: where their launches since make a cap bind, it undoes the
writes and decides again. Shards commit launches one after another, each counting the ones
before it, so together they never pass a cap.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from autoscaler.access.broker_users import user_broker
from autoscaler.config.models import MIN_GAPS, MetricTrigger
from autoscaler.control.executor import execute
from autoscaler.control.observe import Scope, read_sightings
from autoscaler.control.runtime import Loaded, Runtime, collector_paused, utc_now
from autoscaler.lifecycle import InstanceState
from autoscaler.metrics.prometheus import MetricReading as PromReading
from autoscaler.metrics.prometheus import PrometheusReader, with_external
from autoscaler.metrics.registry import MetricsConfigError, broker_domain, source_url
from autoscaler.metrics.workers import QueueLoad, with_worker_loads
from autoscaler.policy import warm
from autoscaler.policy.caps import still_granted
from autoscaler.policy.decide import decide
from autoscaler.policy.history import GAPS_KEPT, NO_HISTORY, QueueHistory, observe_load
from autoscaler.policy.plan import Drain, Launch, Plan, QueuePlan, Reclaim, Resume
from autoscaler.policy.shards import queues_of, shard_of
from autoscaler.policy.snapshot import QueueMetrics, QueueSnapshot, Snapshot
from autoscaler.store import (
    backoffs,
    boots,
    events,
    instances,
    intents,
    job_records,
    leases,
    manual_targets,
    moves,
    queue_samples,
    queue_status,
    rate_limits,
)
from autoscaler.store.db import Session
from autoscaler.store.worker_sightings import ENROLLED_DOMAIN

log = logging.getLogger("autoscaler.control.tick")

EVALUATION_LEASE = leases.EVALUATION
LEASE_TTL = 30.0
"""An evaluation holds the lease at most this long; a crashed one frees it by expiry. The lease
is renewed in the decision's own transaction, so an evaluation slower than this (a source
timing out) writes nothing rather than racing a newer one."""

HAND_MADE_WINDOW_POLLS = 3
"""A hand-made worker counts as capacity until it has not answered for this many polls."""

Enqueue = Callable[[str, str], None]
"""enqueue(step, launch_id): send the lifecycle task `step` ("launch", "drain", "terminate",
"stop", "resume") for a machine; ("evaluate", queue) evaluates a queue now, ("shard", "i")
sends the poll tick of shard i."""


def holder_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass
class TickResult:
    trigger: str
    config_version: int | None = None
    evaluated: list[str] = field(default_factory=list)
    launched: list[str] = field(default_factory=list)
    drains: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    skipped: str | None = None
    shard: str | None = None
    """"i/n" for one shard's evaluation (what Flower and the worker's log show)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "trigger": self.trigger,
            "config_version": self.config_version,
            "evaluated": len(self.evaluated),
            "launched": self.launched,
            "drains": self.drains,
            "resumed": self.resumed,
            "skipped": self.skipped,
            **({"shard": self.shard} if self.shard else {}),
        }


def evaluate(
    rt: Runtime,
    enqueue: Enqueue,
    *,
    trigger: str = "poll",
    queues: Collection[str] | None = None,
    readings: Mapping[str, QueueMetrics] | None = None,
    now: datetime | None = None,
    shard: int | None = None,
) -> TickResult:
    """One evaluation. `trigger="poll"` evaluates the queues whose poll slot is unclaimed;
    other triggers (fast path, cron, manual) evaluate `queues` (all when None) at once.

    With several shards configured, a poll tick without `shard` sends one tick per shard and
    evaluates nothing itself; `shard` evaluates that shard's queues; other triggers evaluate
    the shards of their queues one after another.

    Without a given `now`, the decision is stamped when its snapshot is read, not when the
    tick began: a terminate committed while the metrics were read is in the snapshot, so the
    rows it leads to (a replacement's `created_at`) never predate what they were decided on."""
    with collector_paused():
        with rt.transaction() as session:
            loaded = rt.load(session)
            shards = (
                leases.evaluation_shards(session, loaded.config.evaluation.shards) if loaded else 1
            )
        if loaded is None:
            if not rt.no_config_logged:
                log.info("no config applied yet: nothing to evaluate (run 'autoscaler apply')")
                rt.no_config_logged = True
            return TickResult(trigger, skipped="no config")
        wanted = [q for q in loaded.autoscaled if queues is None or q in queues]
        if shards > 1 and shard is None and trigger == "poll":
            for i in range(shards):
                enqueue("shard", str(i))
            return TickResult(trigger, loaded.version, skipped=f"sent {shards} shard ticks")
        if shard is not None:
            parts = [shard] if 0 <= shard < shards else []
        else:
            parts = sorted({shard_of(q, shards) for q in wanted})
        result = TickResult(trigger, loaded.version)
        if shard is not None:
            result.shard = f"{shard}/{shards}"
        for part in parts:
            one = _evaluate(rt, enqueue, loaded, trigger, wanted, readings, now, part, shards)
            result.evaluated += one.evaluated
            result.launched += one.launched
            result.drains += one.drains
            result.resumed += one.resumed
            result.skipped = one.skipped if len(parts) == 1 else result.skipped
        if not parts:
            result.skipped = f"no shard {shard} of {shards}"
        return result


def _evaluate(
    rt: Runtime,
    enqueue: Enqueue,
    loaded: Loaded,
    trigger: str,
    wanted: list[str],
    readings: Mapping[str, QueueMetrics] | None,
    now: datetime | None,
    shard: int,
    shards: int,
) -> TickResult:
    given = now
    now = now or utc_now()
    result = TickResult(trigger, loaded.version)
    mine = queues_of(wanted, shard, shards)
    with rt.transaction() as session:
        due = _claim_slots(session, loaded, mine, now) if trigger == "poll" else mine
    if not due:
        result.skipped = "nothing due"
        return result
    holder = holder_id()
    lease = leases.evaluation_lease(shard, shards)
    with rt.transaction() as session:
        if not leases.acquire_evaluation(session, shard, shards, holder, LEASE_TTL, now):
            result.skipped = "another evaluation is running"
            return result
    try:
        metrics = dict(readings or {})
        missing = [q for q in due if q not in metrics]
        metrics.update(read_metrics(rt, loaded, missing))
        with rt.transaction() as session:
            if not leases.acquire_evaluation(
                session, shard, shards, holder, LEASE_TTL, utc_now(), renew=True
            ):
                result.skipped = "the evaluation lease expired and was taken over"
                return result
            now = given or utc_now()
            held = None if shards == 1 else queues_of(loaded.config.queues, shard, shards)
            snapshot = build_snapshot(session, rt, loaded, metrics, now, held)
            plan = decide(snapshot, loaded.config, now, held)
            # one shard forgets old chart points: the one holding the first queue (never empty)
            pruner = shard_of(min(loaded.autoscaled), shards) if loaded.autoscaled else shard

            def apply(plan: Plan, snapshot: Snapshot) -> tuple[StoreActions, list[str]]:
                actions = StoreActions(session, loaded, now, snapshot, prune=shard == pruner)
                launched = execute(plan, actions, lambda: uuid.uuid4().hex, due)
                actions.flush()
                return actions, launched

            if held is None or not _capped(loaded) or not _rents(plan, due):
                # one evaluation at a time, or a plan that rents nothing: it cannot pass a cap
                actions, launched = apply(plan, snapshot)
            else:
                # written first, behind a savepoint; then the account lock (held to the commit)
                # and the other shards counted again: only the recount waits for another
                # shard's commit, never the writes. Where their launches since make a cap bind,
                # the writes are undone and the plan decided again.
                savepoint = session.begin_nested()
                actions, launched = apply(plan, snapshot)
                leases.lock_account(session)
                elsewhere = instances.billing_elsewhere(session, held)
                fresh = replace(snapshot, elsewhere=elsewhere)
                if elsewhere == snapshot.elsewhere or still_granted(plan, fresh, loaded.config):
                    savepoint.commit()
                else:
                    savepoint.rollback()
                    actions, launched = apply(decide(fresh, loaded.config, now, held), fresh)
        result.evaluated = list(due)
        result.launched = launched
        result.drains = actions.drained_now
        result.resumed = actions.resumed
    finally:
        with rt.transaction() as session:
            leases.release(session, lease, holder)
    for launch_id in result.launched:
        enqueue("launch", launch_id)
    for launch_id in result.drains:
        enqueue("drain", launch_id)
    for launch_id in result.resumed:
        enqueue("resume", launch_id)
    return result


def _rents(plan: Plan, due: Collection[str]) -> bool:
    """Whether the plan launches or resumes a machine in one of the queues it will apply."""
    wanted = set(due)
    return any(qp.launches or qp.resumes for qp in plan.queues if qp.queue in wanted)


def _capped(loaded: Loaded) -> bool:
    limits = loaded.config.limits
    return limits.max_machines is not None or limits.max_price_per_hour is not None


# --------------------------------------------------------------------------- steps


def _claim_slots(session: Session, loaded: Loaded, queues: list[str], now: datetime) -> list[str]:
    """Queues whose poll slot this tick is the first to claim (a second beat claims nothing)."""
    slots = [(q, int(now.timestamp() // loaded.poll_interval(q))) for q in queues]
    return sorted(leases.claim_ticks(session, slots, "tick", now))


def read_metrics(rt: Runtime, loaded: Loaded, queues: Collection[str]) -> dict[str, QueueMetrics]:
    """Every source read once for the queues it serves; Prometheus values joined in."""
    if not queues:
        return {}
    subset = {q: loaded.config.queues[q] for q in queues}
    out: dict[str, QueueMetrics] = {}
    for group in rt.read_groups(subset):
        try:
            source = rt.source(group)
        except MetricsConfigError as exc:
            for names in group.queues.values():
                for name in names:
                    out[name] = QueueMetrics(
                        name, 0, None, 0, utc_now(), stale=True, error=str(exc)
                    )
            continue
        readings = source.read(list(group.queues))
        for broker_queue, names in group.queues.items():
            for name in names:
                out[name] = replace(readings[broker_queue], queue=name)
    for name in queues:
        auto = loaded.config.queues[name].autoscale
        triggers = [t for t in (auto.scale_up if auto else ()) if isinstance(t, MetricTrigger)]
        if triggers and name in out:
            found: list[PromReading] = []
            for trig in triggers:
                reader = _prometheus(rt, trig)
                if reader is not None:
                    found.extend(reader.read([trig.query]).values())
            out[name] = with_external(out[name], found)
    return out


def _prometheus(rt: Runtime, trig: MetricTrigger) -> PrometheusReader | None:
    """The trigger's Prometheus reader (the runtime's, per config version); None, logged, where
    its address is not set."""
    try:
        return rt.prometheus(trig)
    except MetricsConfigError as exc:
        log.warning("%s", exc)
        return None


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
        instances.billing_elsewhere(session, held) if held is not None and _capped(loaded) else ()
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


# --------------------------------------------------------------------------- the port


class StoreActions:
    """`PlanActions` on the tick's transaction: rows and events now, tasks after commit."""

    def __init__(
        self,
        session: Session,
        loaded: Loaded,
        now: datetime,
        snapshot: Snapshot | None = None,
        prune: bool = True,
    ) -> None:
        self.session = session
        self.loaded = loaded
        self.now = now
        self.snapshot = snapshot
        self.prune = prune  # forget old chart points (one shard of a sharded tick does)
        self.samples: list[dict[str, Any]] = []
        self.intents: list[intents.Intent] = []
        self.events: list[dict[str, Any]] = []
        self.drained_now: list[str] = []
        self.resumed: list[str] = []
        self._resumes: dict[str, Resume] = {}
        self._warm: dict[bool, list[str]] = {True: [], False: []}
        self.statuses: list[dict[str, Any]] = []
        self.histories: dict[str, dict[str, Any]] = {}
        self._marks: dict[bool, list[str]] = {True: [], False: []}
        self._drains: dict[str, Drain] = {}

    def reclaim(self, action: Reclaim) -> None:
        self._marks[False].append(action.launch_id)
        self._warm[False].append(action.launch_id)  # serving again: its pool place is freed
        self.events.append(
            events.event(
                "scale_up", "reclaim", action.reason, queue=action.queue, launch_id=action.launch_id
            )
        )

    def drain_now(self, action: Drain) -> None:
        self._drains[action.launch_id] = action
        if action.keep_warm:
            self._warm[True].append(action.launch_id)

    def resume(self, action: Resume) -> None:
        self._resumes[action.launch_id] = action

    def _resume_all(self) -> None:
        """Every resume in one conditional statement: a stopped machine reconcile retired
        meanwhile is left alone (and the next evaluation rents instead)."""
        moved = moves.start_resumes(
            self.session, {launch_id: r.reason for launch_id, r in self._resumes.items()}, self.now
        )
        for launch_id in moved:
            action = self._resumes[launch_id]
            self.resumed.append(launch_id)
            self.events.append(events.warm_event("resume", action.reason, action.queue, launch_id))

    def _drain_all(self) -> None:
        """Every drain in one conditional statement; a machine that left `ready` meanwhile is
        left alone (and gets no event)."""
        moved = moves.move_many(
            self.session,
            {launch_id: d.reason for launch_id, d in self._drains.items()},
            InstanceState.READY,
            InstanceState.DRAINING,
            self.now,
            drain_requested=False,
        )
        for launch_id in moved:
            action = self._drains[launch_id]
            self.drained_now.append(launch_id)
            self.events.append(
                events.event(
                    "scale_down",
                    "drain",
                    action.reason,
                    queue=action.queue,
                    launch_id=action.launch_id,
                    details={"trigger": action.trigger},
                )
            )

    def drain_when_idle(self, action: Drain) -> None:
        self._marks[True].append(action.launch_id)
        if action.keep_warm:
            self._warm[True].append(action.launch_id)
        self.events.append(
            events.event(
                "scale_down",
                "drain_when_idle",
                action.reason,
                queue=action.queue,
                launch_id=action.launch_id,
                details={"trigger": action.trigger},
            )
        )

    def launch(self, action: Launch, launch_id: str) -> None:
        auto = self.loaded.config.queues[action.queue].autoscale
        key = warm.spec_key(auto) if auto is not None else None
        self.intents.append(
            intents.Intent(
                launch_id,
                action.queue,
                action.provider,
                action.reason,
                key,
                action.fallbacks,
                action.interruptible,
            )
        )
        self.events.append(
            events.event(
                "scale_up",
                "launch",
                action.reason,
                queue=action.queue,
                launch_id=launch_id,
                details={"trigger": action.trigger, "providers": list(action.providers)},
            )
        )

    def queue_done(self, plan: QueuePlan) -> None:
        self._sample(plan)
        qs = self.snapshot.queue(plan.queue) if self.snapshot is not None else None
        if qs is not None:
            self.histories[plan.queue] = history_json(qs.history)
        self.statuses.append(
            {
                "queue": plan.queue,
                "capacity": plan.capacity,
                "floor": plan.floor,
                "ceiling": plan.ceiling,
                "desired": plan.desired,
                "waits": [
                    {
                        "kind": w.kind,
                        "machines": w.machines,
                        "reason": w.reason,
                        "until": w.until.isoformat() if w.until else None,
                    }
                    for w in plan.waits
                ],
                "notes": list(plan.notes),
            }
        )

    def flush(self) -> None:
        """Write everything in a few statements (not one per queue or machine)."""
        self._drain_all()
        self._resume_all()
        moves.set_drain_requested(self.session, self._marks[True], True)
        moves.set_drain_requested(self.session, self._marks[False], False)
        moves.set_keep_warm(self.session, self._warm[True], True)
        moves.set_keep_warm(self.session, self._warm[False], False)
        intents.add_intents(self.session, self.intents, self.now, self.loaded.version)
        self._wait_events()
        events.record(self.session, self.events, self.now)
        intents.link_decisions(self.session, [i[0] for i in self.intents])
        queue_status.record(
            self.session, self.statuses, self.loaded.version, self.now, self.histories
        )
        queue_samples.record(self.session, self.samples, self.now, self.prune)

    def _sample(self, plan: QueuePlan) -> None:
        """The dashboard's chart point for this evaluation, keyed by the reading's own time (the
        API records the same reading under the same key: one row)."""
        qs = self.snapshot.queue(plan.queue) if self.snapshot is not None else None
        m = qs.metrics if qs is not None else None
        if qs is None or m is None or m.stale:
            return
        self.samples.append(
            {
                "queue": plan.queue,
                "at": m.read_at,
                "pending": m.pending,
                "running": m.running,
                "workers": sum(1 for x in qs.machines if x.serving) + max(0, qs.manual_workers),
                "booting": sum(1 for x in qs.machines if x.booting),
                "desired": plan.desired,
            }
        )

    def _wait_events(self) -> None:
        """A wait is recorded when it starts (or its kind changes), not on every tick."""
        names = [s["queue"] for s in self.statuses if s["waits"]]
        if not names:
            return
        before = {
            q: {w["kind"] for w in (st or {}).get("waits", [])}
            for q, st in queue_status.statuses(self.session, names).items()
        }
        for s in self.statuses:
            old = before.get(s["queue"], set())
            for w in s["waits"]:
                if w["kind"] not in old:
                    self.events.append(
                        events.event(
                            "wait",
                            w["kind"],
                            w["reason"],
                            queue=s["queue"],
                            details={"machines": w["machines"], "until": w["until"]},
                        )
                    )


# --------------------------------------------------------------------------- fast path


def fast_path(rt: Runtime, enqueue: Enqueue, now: datetime | None = None) -> TickResult:
    """Scale from zero without waiting a poll: queues with no capacity at all are read every
    second, and one with jobs waiting is evaluated at once. Costs one query when every queue
    has capacity."""
    with rt.transaction() as session:
        loaded = rt.load(session)
        if loaded is None:
            return TickResult("fast", skipped="no config")
        empty = _queues_without_capacity(session, loaded)
    if not empty:
        return TickResult("fast", loaded.version, skipped="every queue has capacity")
    readings = read_metrics(rt, loaded, empty)
    waiting = [
        q
        for q in empty
        if readings[q].pending > 0 and not readings[q].stale and not readings[q].paused
    ]
    if not waiting:
        return TickResult("fast", loaded.version, skipped="no job waits at an empty queue")
    return evaluate(rt, enqueue, trigger="fast", queues=waiting, readings=readings, now=now)


def _queues_without_capacity(session: Session, loaded: Loaded) -> list[str]:
    """Autoscaled queues with no machine serving or on its way (hand-made workers are
    checked by the evaluation itself)."""
    busy = instances.queues_served(session)
    return [q for q in loaded.autoscaled if q not in busy]

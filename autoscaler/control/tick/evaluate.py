"""The evaluation tick, top to bottom (arq's worker loop is the model):

    claim the queues' slots -> take the evaluation lease -> read every source once ->
    build the snapshot from the store -> decide() -> record intents, drain marks, waits and
    events in one transaction -> send the launches, drains and resumes (the outbox).

A crash anywhere leaves the store consistent: intents are rows before any provider call, a
lost send is redone by reconcile (an intent nobody claimed), and an unreleased lease expires.
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
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from autoscaler.control.executor import execute
from autoscaler.control.outbox import Outbox
from autoscaler.control.runtime import Loaded, Runtime, collector_paused, utc_now
from autoscaler.control.tick.actions import StoreActions
from autoscaler.control.tick.read import read_metrics
from autoscaler.control.tick.snapshot import build_snapshot, capped
from autoscaler.policy.caps import still_granted
from autoscaler.policy.decide import decide
from autoscaler.policy.plan import Plan
from autoscaler.policy.shards import queues_of, shard_of
from autoscaler.policy.snapshot import QueueMetrics, Snapshot
from autoscaler.store import (
    instances,
    leases,
)
from autoscaler.store.db import Session

log = logging.getLogger("autoscaler.control.tick")

EVALUATION_LEASE = leases.EVALUATION
LEASE_TTL = 30.0
"""An evaluation holds the lease at most this long; a crashed one frees it by expiry. The lease
is renewed in the decision's own transaction, so an evaluation slower than this (a source
timing out) writes nothing rather than racing a newer one."""


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
    outbox: Outbox,
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
                outbox.shard(i)
            return TickResult(trigger, loaded.version, skipped=f"sent {shards} shard ticks")
        if shard is not None:
            parts = [shard] if 0 <= shard < shards else []
        else:
            parts = sorted({shard_of(q, shards) for q in wanted})
        result = TickResult(trigger, loaded.version)
        if shard is not None:
            result.shard = f"{shard}/{shards}"
        for part in parts:
            one = _evaluate(rt, outbox, loaded, trigger, wanted, readings, now, part, shards)
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
    outbox: Outbox,
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

            if held is None or not capped(loaded) or not _rents(plan, due):
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
        outbox.step("launch", launch_id)
    for launch_id in result.drains:
        outbox.step("drain", launch_id)
    for launch_id in result.resumed:
        outbox.step("resume", launch_id)
    return result


def _rents(plan: Plan, due: Collection[str]) -> bool:
    """Whether the plan launches or resumes a machine in one of the queues it will apply."""
    wanted = set(due)
    return any(qp.launches or qp.resumes for qp in plan.queues if qp.queue in wanted)


def _claim_slots(session: Session, loaded: Loaded, queues: list[str], now: datetime) -> list[str]:
    """Queues whose poll slot this tick is the first to claim (a second beat claims nothing)."""
    slots = [(q, int(now.timestamp() // loaded.poll_interval(q))) for q in queues]
    return sorted(leases.claim_ticks(session, slots, "tick", now))

"""The tick's port to the store: the plan's intents, drain marks, waits and events written in
the decision's transaction (the simulator implements the same `PlanActions`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from autoscaler.control.runtime import Loaded
from autoscaler.control.tick.snapshot import history_json
from autoscaler.lifecycle import InstanceState
from autoscaler.policy import warm
from autoscaler.policy.plan import Drain, Launch, QueuePlan, Reclaim, Resume
from autoscaler.policy.snapshot import Snapshot
from autoscaler.store import (
    events,
    intents,
    moves,
    queue_samples,
    queue_status,
)
from autoscaler.store.db import Session


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

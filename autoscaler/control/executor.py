"""The one place a `Plan` becomes actions (KEDA's executor, apart from its scalers).

`execute` walks a plan in a fixed order — reclaims, drains, resumes, launches, then the queue's
status —
and hands each action to a `PlanActions` port. Production's port (`tick.actions.StoreActions`)
writes launch intents, drain marks and events in the tick's transaction; the simulator's port
changes its virtual world. Both therefore carry out exactly what `decide()` said, in the same
order, with the same rule for drains: a busy machine only ever gets "drain once idle".
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol

from autoscaler.policy.plan import Drain, Launch, Plan, QueuePlan, Reclaim, Resume


class PlanActions(Protocol):
    def reclaim(self, action: Reclaim) -> None:
        """Take a machine asked to leave back into service."""

    def drain_now(self, action: Drain) -> None:
        """The machine is idle: stop it taking jobs now, then destroy it once drained."""

    def drain_when_idle(self, action: Drain) -> None:
        """The machine is busy: mark it; it takes no new job and is drained once idle."""

    def resume(self, action: Resume) -> None:
        """Start a stopped machine of the queue's warm pool again (no new machine)."""

    def launch(self, action: Launch, launch_id: str) -> None:
        """Record the intent to rent one machine (the row comes before any provider call)."""

    def queue_done(self, plan: QueuePlan) -> None:
        """Everything of this queue was handed over: record its numbers and waits."""


def execute(
    plan: Plan,
    actions: PlanActions,
    new_launch_id: Callable[[], str],
    queues: Collection[str] | None = None,
) -> list[str]:
    """Hand every action of `plan` (of `queues` only, when given) to `actions`; returns the
    launch ids of the launches, in order."""
    launched: list[str] = []
    only = None if queues is None else set(queues)  # (a list: `in` cost 0.6 s at 10,000)
    for qp in plan.queues:
        if only is not None and qp.queue not in only:
            continue
        for r in qp.reclaims:
            actions.reclaim(r)
        for d in qp.drains:
            if d.when_idle:
                actions.drain_when_idle(d)
            else:
                actions.drain_now(d)
        for resume in qp.resumes:
            actions.resume(resume)
        for launch in qp.launches:
            launch_id = new_launch_id()
            actions.launch(launch, launch_id)
            launched.append(launch_id)
        actions.queue_done(qp)
    return launched

"""The control plane's outgoing messages, typed: what the tick, reconcile and the lifecycle steps
ask to run next. `control.tasks.CeleryOutbox` sends them as Celery tasks (names and ids only in
their arguments); the tests record them (`tests/control/outbox.py`).

    outbox.step("terminate", launch_id)          a lifecycle step of one machine
    outbox.step("handback", launch_id, after=5)  ... not before 5 s from now
    outbox.evaluate("render")                    evaluate one queue now (a warm miss, a loss)
    outbox.shard(2)                              the poll tick of shard 2
"""

from __future__ import annotations

from typing import Literal, Protocol, get_args

StepName = Literal["launch", "drain", "terminate", "stop", "resume", "handback"]
"""The lifecycle steps, each a task taking one launch id (`control.tasks.STEPS` registers each
with its declaration in `control/steps/`; a test holds the three alike)."""

STEP_NAMES: tuple[StepName, ...] = get_args(StepName)


class Outbox(Protocol):
    """Where the control plane's next steps go. Sending is never a promise: a lost message is
    sent again by reconcile (an intent nobody claimed, a step not finished)."""

    def step(self, step: StepName, launch_id: str, *, after: float | None = None) -> None:
        """Run lifecycle step `step` for one machine (`after` seconds from now, if given)."""

    def evaluate(self, queue: str) -> None:
        """Evaluate `queue` now rather than at its next poll."""

    def shard(self, number: int) -> None:
        """Run the poll tick of shard `number`."""

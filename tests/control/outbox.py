"""An `Outbox` that records instead of sending: what the tick, reconcile and the steps asked
for, in order, as (what, argument) pairs — ("terminate", launch_id), ("evaluate", queue),
("shard", 2)."""

from __future__ import annotations

from dataclasses import dataclass, field

from autoscaler.control.outbox import StepName


@dataclass
class RecordingOutbox:
    sent: list[tuple[str, str | int]] = field(default_factory=list)
    after: dict[tuple[str, str], float] = field(default_factory=dict)
    """The delay asked for a step sent for later, by (step, launch_id)."""

    def step(self, step: StepName, launch_id: str, *, after: float | None = None) -> None:
        self.sent.append((step, launch_id))
        if after is not None:
            self.after[(step, launch_id)] = after

    def evaluate(self, queue: str) -> None:
        self.sent.append(("evaluate", queue))

    def shard(self, number: int) -> None:
        self.sent.append(("shard", number))

    def of(self, step: str) -> list[str | int]:
        """The arguments sent for `step` ("launch", "evaluate", "shard" …), in order."""
        return [arg for what, arg in self.sent if what == step]

    def clear(self) -> None:
        self.sent.clear()
        self.after.clear()

"""Several queues of one config in one simulated run, under one account."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoscaler.policy.snapshot import QueueSnapshot, Snapshot
from autoscaler.sim.world import Result

if TYPE_CHECKING:
    from autoscaler.sim.engine import Simulation


class Account:
    """Several queues of one config in one run: each queue is its own `Simulation` (its trace,
    its machines, its provider), events are handled in one time order, and every evaluation
    shows decide() every queue, so account-wide caps (`limits`) and priorities act across
    them. Each queue is evaluated at its own poll and carries out its own part of the plan."""

    def __init__(self, sims: list[Simulation]) -> None:
        self.sims = sims
        for sim in sims:
            sim.account = self
        self.peak_machines = 0

    def snapshot(self, now: float) -> Snapshot:
        queues: list[QueueSnapshot] = []
        for sim in self.sims:
            sim.now = max(sim.now, now)
            queues.extend(sim.snapshot().queues)
        self.peak_machines = max(self.peak_machines, sum(s.running_machines() for s in self.sims))
        return Snapshot(queues=tuple(queues))

    def run(self) -> list[Result]:
        for sim in self.sims:
            sim.start()
        while True:
            nexts = [
                (at, i) for i, sim in enumerate(self.sims) if (at := sim.next_at()) is not None
            ]
            if not nexts:
                break
            _, i = min(nexts)
            self.sims[i].step()
        return [sim.finish() for sim in self.sims]

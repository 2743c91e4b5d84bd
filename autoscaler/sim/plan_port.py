"""The executor's port on the virtual world (`control.executor.PlanActions`): what production
writes to the store and sends to providers when the tick's plan is applied, done to simulated
machines at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoscaler.lifecycle import InstanceState
from autoscaler.policy.plan import Drain, Launch, QueuePlan, Reclaim, Resume
from autoscaler.sim.world import _DRAINED, SimMachine

if TYPE_CHECKING:
    from autoscaler.sim.engine import Simulation


class _SimActions:
    """The executor's port on the virtual world: what production writes to the store and
    sends to providers, done to simulated machines at once."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def _machine(self, launch_id: str) -> SimMachine | None:
        m = self.sim.machines.get(launch_id)
        return m if m is not None and m.ended_s is None else None

    def reclaim(self, action: Reclaim) -> None:
        m = self._machine(action.launch_id)
        if m is not None:
            m.drain_requested = False
            m.keep_warm = False  # serving again: its pool place is freed
            self.sim.racing.discard(m.launch_id)

    def drain_now(self, action: Drain) -> None:
        m = self._machine(action.launch_id)
        if m is None:
            return
        if action.keep_warm:
            m.keep_warm = True
        race = self.sim.world.drain_race_s
        if race > 0 and m.state == InstanceState.READY and not m.jobs:
            # the worker stops consuming only after the drain reaches it: a job may slip in
            m.drain_requested = True
            self.sim.racing.add(m.launch_id)
            self.sim._push(self.sim.now + race, _DRAINED, m.launch_id)
        else:
            self.sim._release(m)

    def drain_when_idle(self, action: Drain) -> None:
        m = self._machine(action.launch_id)
        if m is None:
            return
        if m.jobs:
            m.drain_requested = True
            if action.keep_warm:
                m.keep_warm = True
        else:
            self.drain_now(action)

    def resume(self, action: Resume) -> None:
        self.sim._resume(action.launch_id)

    def launch(self, action: Launch, launch_id: str) -> None:
        if action.interruptible:
            self.sim._launch(action.reason, action.providers, interruptible=True)
        else:
            self.sim._launch(action.reason, action.providers)

    def queue_done(self, plan: QueuePlan) -> None:
        return None

"""Reconcile on the virtual world: the simulator's machines as production's rows and its
provider's list (`rows`, `provider_views`), and its `ReconcileActions` port, which carries out
what the pure `policy.reconcile` decided each simulated poll — the boot and resume timeouts, a
failed boot its provider reports dead, warm-pool retirements — on simulated machines at once.

What the simulated world cannot produce has no effect here, and says why: its workers are never
silent (a ready machine was heard now), it has no hosts, operators, orphans or lifecycle tasks
to send (a destroy is done at once). A preempted machine is listed stopped, outbid, and judged
by production's rule."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from autoscaler.lifecycle import InstanceState, MachineStatus
from autoscaler.policy.reconcile import Listed, ProviderView, Row
from autoscaler.policy.reconcile_plan import (
    Audit,
    AvoidHost,
    BackOff,
    CancelIfRequested,
    DestroyOrphan,
    DestroySilent,
    EndBackoff,
    Evaluate,
    HandBack,
    KeepOrphans,
    MarkReady,
    Move,
    NoteSilence,
    Preempted,
    Retry,
    SendStep,
    WarmLost,
    WarmMiss,
    WarmStopped,
)
from autoscaler.policy.reconcile_rules import OUTBID
from autoscaler.sim.world import SimMachine

if TYPE_CHECKING:
    from autoscaler.sim.engine import Simulation

S = InstanceState

GONE_STATES = (S.TERMINATED, S.LOST, S.FAILED)


def _since(m: SimMachine) -> float:
    """When it entered its state."""
    if m.state == S.READY and m.ready_s is not None:
        return m.ready_s
    if m.state == S.STOPPING and m.stopping_s is not None:
        return m.stopping_s
    if m.state == S.STOPPED and m.stopped_s is not None:
        return m.stopped_s
    resumed = m.stopped[-1][1] if m.stopped else None
    if m.state == S.RESUMING and resumed is not None:
        return resumed
    return m.created_s


def _status(sim: Simulation, m: SimMachine) -> MachineStatus:
    """What its provider lists it as now."""
    if m.preempted_s is not None:
        return MachineStatus.STOPPED
    if m.dead_s is not None and sim.now >= m.dead_s:
        return MachineStatus.DEAD
    if m.state == S.STOPPED:
        return MachineStatus.STOPPED
    if m.state == S.BOOTING:
        return MachineStatus.STARTING
    return MachineStatus.RUNNING


def _live(sim: Simulation) -> list[SimMachine]:
    return [m for m in sim.live.values() if m.ended_s is None]


def rows(sim: Simulation) -> tuple[Row, ...]:
    """Its live machines as the store's rows: a ready machine's worker was heard now (a
    simulated worker is never silent); a booting or resuming one's not yet."""
    at = sim._at
    return tuple(
        Row(
            m.launch_id,
            sim.queue,
            m.provider,
            m.state,
            at(_since(m)),
            provider_instance_id=m.launch_id,
            last_seen_at=at(sim.now) if m.state == S.READY else None,
            running_tasks=len(m.jobs),
            keep_warm=m.keep_warm,
            spec_key=m.spec_key,
            ready_at=at(m.ready_s) if m.ready_s is not None else None,
        )
        for m in _live(sim)
    )


def provider_views(sim: Simulation) -> dict[str, ProviderView]:
    """Each simulated provider's list: always read, its machines with a worker of their own
    (never ready by running alone)."""
    machines: dict[str, list[Listed]] = {name: [] for name in sim.providers}
    for m in _live(sim):
        outbid = OUTBID if m.preempted_s is not None else None
        listed = Listed(m.launch_id, m.launch_id, m.launch_id, _status(sim, m), raw_status=outbid)
        machines.setdefault(m.provider, []).append(listed)
    return {
        name: ProviderView(name, listed=True, machines=tuple(ms)) for name, ms in machines.items()
    }


class SimReconcileActions:
    """The `ReconcileActions` port on the virtual world: moves done at once."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def _machine(self, launch_id: str, src: InstanceState) -> SimMachine | None:
        """The machine if it is still live and in `src` (the conditional move's condition)."""
        m = self.sim.live.get(launch_id)
        return m if m is not None and m.ended_s is None and m.state == src else None

    def _to(self, m: SimMachine, dst: InstanceState) -> None:
        if dst in (S.TERMINATING, *GONE_STATES):
            self.sim._destroy(m)  # the destroy is at once: billing ends (and its tail)
        else:
            m.state = dst

    # ------------------------------------------------------------ moves
    def mark_ready(self, action: MarkReady) -> None:
        """Not made here: a simulated worker comes up by its own event (`_BOOTED`, `_RESUMED`),
        the simulated rows never show it heard while booting or resuming."""

    def move(self, action: Move) -> bool:
        m = self._machine(action.launch_id, action.src)
        if m is None:
            return False
        if action.src == S.STOPPED and action.dst == S.TERMINATING:
            self.sim.result.retired += 1  # past keep_for, above size or unfit
        self._to(m, action.dst)
        return True

    def destroy_silent(self, action: DestroySilent) -> bool:
        m = self._machine(action.launch_id, action.src)
        if m is None:
            return False
        self._to(m, S.TERMINATING)
        return True

    def warm_miss(self, action: WarmMiss) -> bool:
        m = self._machine(action.launch_id, S.RESUMING)
        if m is None:
            return False
        self.sim.result.warm_misses += 1  # no backoff: the next evaluation rents fresh
        self._to(m, S.TERMINATING)
        return True

    # ------------------------------------------------------------ consequences
    def hand_back(self, action: HandBack) -> None:
        """Nothing more: the destroy hands a preempted machine's jobs back (`_hand_back`)."""

    def preempted(self, action: Preempted) -> None:
        """Nothing more: a simulated preemption is counted when the provider makes it."""

    def cancel_if_requested(self, action: CancelIfRequested) -> None:
        """No operator cancels a simulated launch."""

    def audit(self, action: Audit) -> None:
        """The simulator keeps no events."""

    def warm_stopped(self, action: WarmStopped) -> None:
        """Counted when the stop begins (`Result.stops`)."""

    def warm_lost(self, action: WarmLost) -> None:
        self.sim.result.warm_misses += 1

    def back_off(self, action: BackOff) -> None:
        self.sim._rental_failed(action.provider, action.reason)

    def end_backoff(self, action: EndBackoff) -> None:
        self.sim.backoffs.pop(action.provider, None)

    def avoid_host(self, action: AvoidHost) -> None:
        """Simulated providers have no hosts."""

    # ------------------------------------------------------------ the rest of the round
    def note_silence(self, actions: Sequence[NoteSilence]) -> None:
        """A simulated worker is never silent."""

    def retry(self, actions: Sequence[Retry]) -> None:
        """Simulated steps are never lost: their events are already on the clock."""

    def keep_orphans(self, action: KeepOrphans) -> None:
        """The simulated providers run no machine without its row."""

    def send_step(self, action: SendStep) -> None:
        """Done with the move itself (a simulated destroy or stop is at once)."""

    def evaluate(self, action: Evaluate) -> None:
        """The poll's evaluation follows the round at once (`Simulation.step`)."""

    def destroy_orphan(self, action: DestroyOrphan) -> None:
        """No orphans in the simulated world."""

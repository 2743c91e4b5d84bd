"""The simulator's machine events beyond boots and jobs: warm-pool stops and resumes, the
reconcile round each poll, and interruptible machines' preemptions: functions of a
`Simulation`, its methods of the same names (`_stop` is `stop`).

Warm pools (`autoscale.warm_pool`): a drain decide() marked `keep_warm` stops the machine once
drained instead of destroying it — full price for the provider's stop time, then only its
storage price while stopped; a `Resume` starts it again, ready after a resume time, or a warm
miss (destroyed, no backoff: the next evaluation rents fresh) at the provider's resume failure
rate; stopped machines past `keep_for`, above `size` or unfit are destroyed each poll by
production's reconcile (`policy.reconcile`, through `sim.reconcile_port`), which also judges the
resume timeout (a miss with no ready worker by `resume_timeout`) and the boot timeout, at its
round, as production does. The numbers and where they come from: `sim/provider.py`. A resumed
machine appears to decide() as production's row shows it (`store.fleet.start_resumes`): rented
at its first rental, its last task forgotten at the resume (idle since it is ready again); only
cold boots feed the queue's boot estimate (a resume is not a boot), as
`store.fleet.boot_estimates` counts them.

Interruptible machines (`instance.interruptible`): a launch decide() marked `interruptible`
rents at the bid (`Interruptible.price` of its provider's on-demand price) and the snapshot
says so (`Machine.interruptible`). While rented it is preempted after an exponential time at
`World.preemption_rate` per machine-hour (a generator of its own, so the other draws stay as
they were): its provider stops it (its GPU bills no more, its disk does) and its worker stops;
reconcile's next round sees the provider's listing (stopped, outbid), destroys it, hands back
its jobs and evaluates the queue, as in production (until then decide() sees its row); the
jobs come back to the broker `World.handback_s` after that round — run again from the start,
first in line, under `acks: late` (`Result.reruns`), lost under `acks: early` (`Result.lost`:
never run). The assumptions: `sim/provider.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoscaler.control.reconcile_executor import apply_reconcile
from autoscaler.lifecycle import InstanceState
from autoscaler.policy import reconcile as policy_reconcile
from autoscaler.sim.reconcile_port import SimReconcileActions, provider_views, rows
from autoscaler.sim.world import _HANDED_BACK, _MISSED, _PREEMPTED, _RESUMED, _STOPPED, SimMachine

if TYPE_CHECKING:
    from autoscaler.sim.engine import Simulation


# ---------------------------------------------------------------------- warm pool
def stop(self: Simulation, m: SimMachine) -> None:
    m.state = InstanceState.STOPPING
    m.stopping_s = self.now
    m.drain_requested = False
    self.racing.discard(m.launch_id)
    m.epoch += 1
    self.result.stops += 1
    self._push(self.now + self._params(m).stop_s, _STOPPED, f"{m.launch_id}#{m.epoch}")


def current(self: Simulation, payload: str, state: InstanceState) -> SimMachine | None:
    """The machine of a stop or resume event still in `state` since it (else stale)."""
    launch_id, _, epoch = payload.rpartition("#")
    m = self.machines[launch_id]
    if m.ended_s is not None or m.state != state or m.epoch != int(epoch):
        return None
    if m.preempted_s is not None:
        return None  # its provider stopped it meanwhile: reconcile judges it
    return m


def stopped(self: Simulation, payload: str) -> None:
    m = self._current(payload, InstanceState.STOPPING)
    if m is None:
        return
    m.state = InstanceState.STOPPED
    m.stopped_s = self.now
    m.stopped.append((self.now, None))


def resume(self: Simulation, launch_id: str) -> None:
    """Start a stopped machine (the executor's `resume`): a machine retired meanwhile is
    left alone, as production's conditional move does."""
    m = self.live.get(launch_id)
    if m is None or m.state != InstanceState.STOPPED:
        return
    since, _ = m.stopped[-1]
    m.stopped[-1] = (since, self.now)
    m.state = InstanceState.RESUMING
    m.keep_warm = False
    m.last_task_s = None  # idle since it is ready again, as `fleet.start_resumes` says
    m.resumes += 1
    m.epoch += 1
    self.result.resumes += 1
    self._arm_preemption(m)  # billing again: outbid again at any time
    outcome = self._provider_of(m).resume(self.auto.warm_pool.resume_timeout)
    if outcome.at_timeout:
        return  # no ready worker by resume_timeout: reconcile's warm miss, at its round
    kind = _RESUMED if outcome.ok else _MISSED
    self._push(self.now + outcome.after_s, kind, f"{m.launch_id}#{m.epoch}")


def resumed(self: Simulation, payload: str) -> None:
    """A warm hit: its worker is up again."""
    m = self._current(payload, InstanceState.RESUMING)
    if m is None:
        return
    m.state = InstanceState.READY
    m.ready_s = self.now
    self.result.warm_hits += 1
    self._dispatch()


def missed(self: Simulation, payload: str) -> None:
    """A warm miss: destroyed, no backoff (the next evaluation rents a fresh machine)."""
    m = self._current(payload, InstanceState.RESUMING)
    if m is None:
        return
    self.result.warm_misses += 1
    self._destroy(m)


def reconcile_round(self: Simulation) -> None:
    """Production's reconcile round on the virtual world: the pure `policy.reconcile` on
    the machines as rows and the provider's list, applied through the simulator's port
    (boot and resume timeouts, machines the provider reports dead, warm-pool retirements
    by `policy.warm.retirements`), as production decides them each poll."""
    at = self._at(self.now)
    plan = policy_reconcile.reconcile(rows(self), provider_views(self), {}, self.config, at)
    apply_reconcile(plan, SimReconcileActions(self))


# ---------------------------------------------------------------------- interruptible
def arm_preemption(self: Simulation, m: SimMachine) -> None:
    """Draw when an interruptible machine billing from now is outbid (memoryless: a stop
    and a resume draw again; the event of an earlier epoch is stale)."""
    rate = self.world.preemption_rate
    if not m.interruptible or rate <= 0:
        return
    after = self.preempt_rng.expovariate(rate / 3600.0)
    self._push(self.now + after, _PREEMPTED, f"{m.launch_id}#{m.epoch}")


def preempted(self: Simulation, payload: str) -> None:
    """Outbid: the provider stops it. Its GPU bills no more (its disk does, at its storage
    price, until the destroy) and its worker stops with the jobs it ran: lost under early acks,
    held by the broker until handed back under late acks. Everything else is as production's
    row shows it: decide() sees the machine as its row says (serving) until reconcile's next
    round reads the provider's listing (stopped, outbid), destroys it, hands its jobs back and
    evaluates the queue (`sim.reconcile_port`)."""
    launch_id, _, epoch = payload.rpartition("#")
    m = self.machines[launch_id]
    if (
        m.ended_s is not None
        or m.preempted_s is not None
        or m.epoch != int(epoch)
        or m.state
        not in (
            InstanceState.BOOTING,
            InstanceState.RESUMING,
            InstanceState.READY,
        )
    ):
        return
    self.result.preemptions += 1
    jobs = sorted(m.jobs)
    for job in jobs:
        self.result.starts.pop(job, None)
        if self.world.acks == "early":
            self.result.lost.append(job)
        else:
            self.result.rerun_work_s += self.now - m.jobs[job]
    m.jobs = {}
    m.preempted_s = self.now
    m.stopped.append((self.now, None))  # the provider stopped it: its disk bills on
    self.racing.discard(m.launch_id)
    if jobs and self.world.acks != "early":
        m.held_back = jobs
        self.handing_back += len(jobs)  # unacked at the broker: in flight until handed back
    self._sample()


def hand_back(self: Simulation, m: SimMachine) -> None:
    """A preempted machine destroyed: the jobs its worker held go back to the broker
    `World.handback_s` later (the hand-back step's grace and the requeue)."""
    if m.held_back:
        back = ",".join(str(j) for j in m.held_back)
        m.held_back = []
        self._push(self.now + self.world.handback_s, _HANDED_BACK, back)


def handed_back(self: Simulation, payload: str) -> None:
    """A preempted machine's jobs are in the broker again, first in line (kombu restores
    them where consumers take next; RabbitMQ requeues them in place)."""
    jobs = [int(j) for j in payload.split(",")]
    self.handing_back -= len(jobs)
    self.result.reruns += len(jobs)
    for job in reversed(jobs):
        self.pending.appendleft(job)
    self._dispatch()
    if self.fast_path and self._capacity() == 0:
        self._evaluate()

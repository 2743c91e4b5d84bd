"""The virtual world: a queue of jobs, simulated machines, and a policy called every poll.

Discrete events on a virtual clock (no sleeping, no wall clock): job arrivals, boots, boot
failures caught at the boot timeout, job completions and policy ticks. The policy is any
`decide`-shaped callable, so our decide() runs unchanged and the baselines run beside it.
A worker runs one job at a time and takes the oldest pending job (FIFO); which idle worker
takes it is drawn from the seeded generator, like workers racing to pull from a broker.
Billing runs from the rental until the machine is destroyed: boot and idle tails are paid.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from autoscaler.config.models import Autoscale, Config
from autoscaler.control.executor import execute
from autoscaler.lifecycle import InstanceState
from autoscaler.policy.backoff import after_failure
from autoscaler.policy.plan import Drain, Launch, Plan, QueuePlan, Reclaim
from autoscaler.policy.snapshot import (
    BackoffState,
    Machine,
    QueueMetrics,
    QueueSnapshot,
    Snapshot,
)
from autoscaler.sim.provider import ProviderParams, SimProvider
from autoscaler.sim.trace import Job

Policy = Callable[[Snapshot, Config, datetime], Plan]

EPOCH = datetime(2025, 3, 3, tzinfo=UTC)
"""Virtual time zero: a Monday, midnight UTC (schedules in the config see this calendar)."""

DAY_S = 86400.0
TAIL_S = 4 * 3600.0
"""After the last arrival (or the day's end), the run continues this long at most so that idle
tails are billed and late jobs may still be served; then it stops."""

_ARRIVE, _BOOTED, _BOOT_FAILED, _FINISH, _TICK = range(5)


@dataclass
class SimMachine:
    launch_id: str
    created_s: float
    price: float
    state: InstanceState = InstanceState.BOOTING
    ready_s: float | None = None
    ended_s: float | None = None
    job: int | None = None
    job_started_s: float = 0.0
    last_task_s: float | None = None
    drain_requested: bool = False
    launched_for: str = ""


@dataclass
class Result:
    """Raw outcome of one run; `report.summarize` turns it into figures."""

    policy: str
    jobs: list[Job]
    starts: dict[int, float]
    machines: list[SimMachine]
    end_s: float
    price_per_hour: float
    killed: int = 0
    failed_rentals: int = 0
    waits_by_cap: int = 0
    peak_machines: int = 0
    max_over_limit: int = 0
    evaluations: int = 0
    log: list[str] = field(default_factory=list)


class Simulation:
    def __init__(
        self,
        config: Config,
        queue: str,
        jobs: list[Job],
        policy: Policy,
        *,
        name: str = "policy",
        seed: int = 0,
        fast_path: bool = True,
        keep_log: bool = False,
        day_s: float = DAY_S,
        tail_s: float = TAIL_S,
    ) -> None:
        q = config.queues.get(queue)
        if q is None or q.autoscale is None:
            raise ValueError(f"queue {queue!r} has no autoscale block in the config")
        self.config = config
        self.auto: Autoscale = q.autoscale
        self.queue = queue
        self.jobs = jobs
        self.policy = policy
        self.name = name
        self.fast_path = fast_path
        self.keep_log = keep_log
        self.day_s = day_s
        self.tail_s = tail_s
        self.rng = random.Random(seed)
        self.params = ProviderParams.for_queue(config, self.auto)
        self.provider = SimProvider(self.params, random.Random(seed + 1))
        self.poll = self.auto.poll_interval or config.poll_interval
        self.boot_timeout = self.auto.boot_timeout or config.boot_timeout

        self.now = 0.0
        self.events: list[tuple[float, int, int, int | str]] = []
        self.seq = 0
        self.pending: deque[int] = deque()
        self.machines: dict[str, SimMachine] = {}
        self.backoff: BackoffState | None = None
        self.launch_seq = 0
        self.result = Result(name, jobs, {}, [], 0.0, self.params.price_per_hour)

    # ------------------------------------------------------------------ events
    def _push(self, at: float, kind: int, payload: int | str) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, payload))

    def run(self) -> Result:
        for i, job in enumerate(self.jobs):
            self._push(job.arrival_s, _ARRIVE, i)
        last = max((j.arrival_s for j in self.jobs), default=0.0)
        horizon = max(self.day_s, last) + self.tail_s
        self._push(0.0, _TICK, 0)
        arrivals_left = len(self.jobs)
        while self.events:
            at, _, kind, payload = heapq.heappop(self.events)
            if at > horizon:
                break
            self.now = at
            if kind == _ARRIVE:
                assert isinstance(payload, int)
                arrivals_left -= 1
                self.pending.append(payload)
                self._dispatch()
                if self.fast_path and self._capacity() == 0:
                    self._evaluate()  # scale from zero without waiting for the poll
            elif kind == _BOOTED:
                self._booted(str(payload))
            elif kind == _BOOT_FAILED:
                self._boot_failed(str(payload))
            elif kind == _FINISH:
                self._finish(str(payload))
            elif kind == _TICK:
                self._evaluate()
                if arrivals_left == 0 and not self.pending and not self._live():
                    break
                self._push(self.now + self.poll, _TICK, 0)
        self.result.end_s = min(self.now, horizon)
        for m in self.machines.values():
            if m.ended_s is None:
                m.ended_s = self.result.end_s
        self.result.machines = list(self.machines.values())
        return self.result

    # ------------------------------------------------------------------ world
    def _live(self) -> list[SimMachine]:
        return [m for m in self.machines.values() if m.ended_s is None]

    def _capacity(self) -> int:
        return sum(
            1
            for m in self._live()
            if m.state == InstanceState.BOOTING
            or (m.state == InstanceState.READY and not m.drain_requested)
        )

    def _dispatch(self) -> None:
        while self.pending:
            idle = [
                m
                for m in self._live()
                if m.state == InstanceState.READY and m.job is None and not m.drain_requested
            ]
            if not idle:
                return
            m = idle[self.rng.randrange(len(idle))]
            job = self.pending.popleft()
            m.job = job
            m.job_started_s = self.now
            self.result.starts[job] = self.now
            self._push(self.now + self.jobs[job].runtime_s, _FINISH, m.launch_id)

    def _booted(self, launch_id: str) -> None:
        m = self.machines[launch_id]
        if m.ended_s is not None:
            return  # destroyed while booting (a baseline may do that)
        m.state = InstanceState.READY
        m.ready_s = self.now
        self.backoff = None  # a machine came up: the provider works again
        self._dispatch()

    def _boot_failed(self, launch_id: str) -> None:
        m = self.machines[launch_id]
        if m.ended_s is not None:
            return
        self._destroy(m)
        self._rental_failed("machine never became ready before the boot timeout")

    def _rental_failed(self, error: str) -> None:
        self.result.failed_rentals += 1
        self.backoff = after_failure(
            self.backoff,
            self.queue,
            self.auto.provider,
            self._at(self.now),
            self.config.backoff,
            error,
        )

    def _finish(self, launch_id: str) -> None:
        m = self.machines[launch_id]
        if m.job is None or m.ended_s is not None:
            return  # the job was killed with its machine
        if self.now < m.job_started_s + self.jobs[m.job].runtime_s - 1e-6:
            return  # a stale completion of a killed-and-restarted job
        m.job = None
        m.last_task_s = self.now
        if m.drain_requested:
            self._destroy(m)
        self._dispatch()

    def _destroy(self, m: SimMachine) -> None:
        if m.job is not None:
            # Only a baseline can get here: the job is lost and goes back to the queue.
            self.result.killed += 1
            self.result.starts.pop(m.job, None)
            self.pending.appendleft(m.job)
            m.job = None
        m.state = InstanceState.TERMINATED
        m.ended_s = self.now

    # ------------------------------------------------------------------ policy
    def _at(self, s: float) -> datetime:
        return EPOCH + timedelta(seconds=s)

    def snapshot(self) -> Snapshot:
        oldest = (self.now - self.jobs[self.pending[0]].arrival_s) if self.pending else None
        live = self._live()
        metrics = QueueMetrics(
            queue=self.queue,
            pending=len(self.pending),
            oldest_pending_age=oldest,
            in_flight=sum(1 for m in live if m.job is not None),
            read_at=self._at(self.now),
        )
        machines = tuple(
            Machine(
                launch_id=m.launch_id,
                state=m.state,
                created_at=self._at(m.created_s),
                provider=self.auto.provider,
                ready_at=self._at(m.ready_s) if m.ready_s is not None else None,
                running_tasks=1 if m.job is not None else 0,
                last_task_at=self._at(m.last_task_s) if m.last_task_s is not None else None,
                drain_requested=m.drain_requested,
                launched_for=m.launched_for,
                price_per_hour=m.price,
            )
            for m in live
        )
        backoffs = (self.backoff,) if self.backoff is not None else ()
        return Snapshot(queues=(QueueSnapshot(self.queue, metrics, machines, 0, backoffs),))

    def _evaluate(self) -> None:
        self.result.evaluations += 1
        plan = self.policy(self.snapshot(), self.config, self._at(self.now))
        qp = plan.for_queue(self.queue)
        if qp is None:
            return
        if self.keep_log and (qp.launches or qp.reclaims or qp.drains):
            self.result.log.append(f"t={self.now:.0f}s\n{plan.describe()}")
        self.result.waits_by_cap += sum(1 for w in qp.waits if w.kind == "spend_cap")
        execute(plan, _SimActions(self), lambda: "", (self.queue,))
        live = len(self._live())
        self.result.peak_machines = max(self.result.peak_machines, live)
        self.result.max_over_limit = max(
            self.result.max_over_limit, self._capacity() - self.auto.max_workers
        )
        self._dispatch()

    def _launch(self, reason: str) -> None:
        """Rent one simulated machine (the executor's `launch`, on the virtual provider)."""
        self.launch_seq += 1
        outcome = self.provider.rent()
        if not outcome.rented:
            self._rental_failed(outcome.error or "rental failed")
            return
        launch_id = f"{self.queue}-{self.launch_seq}"
        m = SimMachine(launch_id, self.now, self.params.price_per_hour, launched_for=reason)
        self.machines[launch_id] = m
        if outcome.boots:
            self._push(self.now + outcome.boot_s, _BOOTED, launch_id)
        else:
            self._push(self.now + self.boot_timeout, _BOOT_FAILED, launch_id)


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

    def drain_now(self, action: Drain) -> None:
        m = self._machine(action.launch_id)
        if m is not None:
            self.sim._destroy(m)

    def drain_when_idle(self, action: Drain) -> None:
        m = self._machine(action.launch_id)
        if m is None:
            return
        if m.job is not None:
            m.drain_requested = True
        else:
            self.sim._destroy(m)

    def launch(self, action: Launch, launch_id: str) -> None:
        self.sim._launch(action.reason)

    def queue_done(self, plan: QueuePlan) -> None:
        return None

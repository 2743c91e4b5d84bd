"""The virtual world: a queue of jobs, simulated machines, and a policy called every poll.

Discrete events on a virtual clock (no sleeping, no wall clock): job arrivals, boots, boot
failures, job completions and policy ticks. The policy is any `decide`-shaped callable, so our
decide() runs unchanged and the baselines run beside it. A worker runs up to
`World.worker_concurrency` jobs at a time and takes the oldest pending job (FIFO); which free
worker takes it is drawn from the seeded generator, like workers racing to pull from a broker.
Billing runs from the rental until the machine is destroyed: boot and idle tails are paid, plus
`World.per_rental_dollars` per rental (disk, image pull). Which stretch bills what is the one
money rule production bills by (`policy.billing`, read through `SimMachine.life`).

`World` holds what makes the world harder than exact and instant (all off by default, so the
default run is the one the tests pin): metrics read `metric_lag_s` late, the source's blind
spots (no in-flight/running count, no job age), a drain that races a job pickup for
`drain_race_s` (a job taken in the window is finished first, then the machine goes), a failed
boot seen when the provider reports the machine dead rather than at the boot timeout, billing
that runs `destroy_billing_s` past a destroy, and a node kept `release_delay_s` after its
worker left (a cluster's scale-in delay).

Several providers (`autoscale.provider: [a, b]`, `placement`): one `SimProvider` per listed
provider, each with its price, boot-time distribution, failure rates and capacity windows
(`World.outages`). A launch ranks the offers of `Launch.providers` not in backoff when decide()
planned it with `policy.placement.rank` — production's ranking — and rents the first that has
capacity: a failed rental moves to the next, and each provider that failed gets its own
(queue, provider) backoff, all of which the snapshot shows decide(). Machines remember their
provider: they bill its price, stop and resume at its numbers, and a machine that comes up ends
that provider's backoff. One listed provider: the run is the one before placement.

Warm pools, reconcile rounds and interruptible machines: `sim/machine_events.py`.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from autoscaler.config.models import Autoscale, Config
from autoscaler.control.executor import execute
from autoscaler.lifecycle import InstanceState
from autoscaler.policy import billing, warm
from autoscaler.policy.backoff import active_backoff, after_failure
from autoscaler.policy.billing import Charge
from autoscaler.policy.history import QueueHistory, observe_load
from autoscaler.policy.placement import Candidate, rank
from autoscaler.policy.plan import Plan
from autoscaler.policy.snapshot import (
    BackoffState,
    Machine,
    QueueMetrics,
    QueueSnapshot,
    Snapshot,
)
from autoscaler.sim import machine_events
from autoscaler.sim.account import Account
from autoscaler.sim.plan_port import _SimActions
from autoscaler.sim.provider import (
    DEFAULT_BOOT_S,
    ProviderParams,
    SimProvider,
)
from autoscaler.sim.trace import Job
from autoscaler.sim.world import (
    _ARRIVE,
    _BOOTED,
    _DRAINED,
    _FINISH,
    _HANDED_BACK,
    _MISSED,
    _PREEMPTED,
    _RESUMED,
    _STOPPED,
    _TICK,
    DAY_S,
    EPOCH,
    TAIL_S,
    Acks,
    Result,
    SimMachine,
    World,
)

__all__ = [
    "DAY_S",
    "EPOCH",
    "TAIL_S",
    "Account",
    "Acks",
    "Policy",
    "Result",
    "SimMachine",
    "Simulation",
    "World",
]

Policy = Callable[[Snapshot, Config, datetime], Plan]

RUNTIME_WINDOW_S = 86400.0
"""The history's mean runtime is over the jobs finished in the last day (as the loop's,
`store.job_records.STATS_WINDOW`)."""
BOOT_HISTORY = 5
"""The boot estimate is the longest of the last this many boots (as the loop's)."""


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
        world: World | None = None,
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
        self.world = world or World()
        self.rng = random.Random(seed)
        self.providers: dict[str, SimProvider] = {}
        """One simulated provider per provider the queue lists, in the order written. The
        first draws from the generator one provider always had (seed + 1), so a one-provider
        run is the run before placement; the others from their own, seeded by their name."""
        for i, pname in enumerate(self.auto.providers):
            self.providers[pname] = SimProvider(
                ProviderParams.for_provider(config, self.auto, pname),
                random.Random(seed + 1) if i == 0 else random.Random(f"{seed}:{pname}"),
                [o for o in self.world.outages if o.provider == pname],
            )
        self.provider = next(iter(self.providers.values()))
        """The first listed provider."""
        self.params = self.provider.params
        settings = config.queue_settings(queue)
        self.poll = settings.poll_interval
        self.boot_timeout = settings.boot_timeout
        self.spec_key = warm.spec_key(self.auto)
        """What its rentals are rented as: decide() resumes only machines of this spec."""

        self.now = 0.0
        self.events: list[tuple[float, int, int, int | str]] = []
        self.seq = 0
        self.pending: deque[int] = deque()
        self.machines: dict[str, SimMachine] = {}
        self.live: dict[str, SimMachine] = {}
        self.racing: set[str] = set()
        self.account: Account | None = None
        """Set when several queues share one account (`Account`): decide() sees them all."""
        self.horizon = 0.0
        self.arrivals_left = 0
        self.done = False
        """Machines not yet destroyed (insertion order = rental order)."""
        self.samples: list[tuple[float, int, int, int]] = []
        """(time, pending, index of the oldest pending job or -1, running) at each change,
        for metrics read late."""
        self.backoffs: dict[str, BackoffState] = {}
        """Per listed provider, its (queue, provider) backoff after failed rentals."""
        self.held: frozenset[str] = frozenset()
        """The providers in backoff when decide() last planned: its launches skip them."""
        self.launch_seq = 0
        self.history = QueueHistory()
        """What the loop would have learned: quiet gaps from the readings, runtimes of
        finished jobs as the workers report them, the last boots."""
        self.runtimes: deque[tuple[float, float]] = deque()
        """(finished at, runtime) of the jobs finished within RUNTIME_WINDOW_S."""
        self.runtime_sum = 0.0
        self.boots: deque[float] = deque(maxlen=BOOT_HISTORY)
        self.bid = self.auto.instance.interruptible
        """The queue's bid (None: every machine on demand)."""
        self.preempt_rng = random.Random(f"{seed}:preempt")
        """Draws preemptions only, so a run without them draws what it always drew."""
        self.handing_back = 0
        """Jobs of preempted machines not yet back in the broker (counted in flight)."""
        prices = [p.params.price_per_hour for p in self.providers.values()]
        if self.bid is not None:  # the lower bound at the cheapest hour on offer: the bid
            prices += [self.bid.price(p) for p in prices]
        self.result = Result(
            name,
            jobs,
            {},
            [],
            0.0,
            min(prices),
            per_rental_dollars=self.world.per_rental_dollars,
            interruptible=self.bid is not None,
        )

    @property
    def backoff(self) -> BackoffState | None:
        """The first listed provider's backoff (the only one of a one-provider queue)."""
        return self.backoffs.get(self.auto.providers[0])

    def _params(self, m: SimMachine) -> ProviderParams:
        """The numbers of the provider `m` came from."""
        return self.providers[m.provider].params if m.provider in self.providers else self.params

    def _provider_of(self, m: SimMachine) -> SimProvider:
        return self.providers.get(m.provider, self.provider)

    # ------------------------------------------------------------------ events
    def _push(self, at: float, kind: int, payload: int | str) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, payload))

    def run(self) -> Result:
        self.start()
        while self.step():
            pass
        return self.finish()

    def start(self) -> None:
        for i, job in enumerate(self.jobs):
            self._push(job.arrival_s, _ARRIVE, i)
        last = max((j.arrival_s for j in self.jobs), default=0.0)
        self.horizon = max(self.day_s, last) + self.tail_s
        self._push(0.0, _TICK, 0)
        self.arrivals_left = len(self.jobs)
        self.done = False

    def next_at(self) -> float | None:
        """When the next event happens; None once this run is over."""
        if self.done or not self.events or self.events[0][0] > self.horizon:
            return None
        return self.events[0][0]

    def step(self) -> bool:
        """Handle the next event; False once the run is over."""
        if self.next_at() is None:
            self.done = True
            return False
        at, _, kind, payload = heapq.heappop(self.events)
        self.now = at
        if kind == _ARRIVE:
            assert isinstance(payload, int)
            self.arrivals_left -= 1
            self.pending.append(payload)
            self._dispatch()
            if self.fast_path and self._capacity() == 0:
                self._evaluate()  # scale from zero without waiting for the poll
        elif kind == _BOOTED:
            self._booted(str(payload))
        elif kind == _FINISH:
            self._finish(str(payload))
        elif kind == _DRAINED:
            self._drained(str(payload))
        elif kind == _STOPPED:
            self._stopped(str(payload))
        elif kind == _RESUMED:
            self._resumed(str(payload))
        elif kind == _MISSED:
            self._missed(str(payload))
        elif kind == _PREEMPTED:
            self._preempted(str(payload))
        elif kind == _HANDED_BACK:
            self._handed_back(str(payload))
        elif kind == _TICK:
            self._reconcile()
            self._evaluate()
            if (
                self.arrivals_left == 0
                and not self.pending
                and not self.live
                and not self.handing_back
            ):
                self.done = True
                return False
            self._push(self.now + self.poll, _TICK, 0)
        return True

    def finish(self) -> Result:
        self.result.end_s = min(self.now, self.horizon)
        for m in self.live.values():
            if m.ended_s is None:
                m.ended_s = self.result.end_s
        self.result.machines = list(self.machines.values())
        return self.result

    # ------------------------------------------------------------------ world
    def _live(self) -> list[SimMachine]:
        return list(self.live.values())

    def _capacity(self) -> int:
        return sum(
            1
            for m in self.live.values()
            if m.state in (InstanceState.BOOTING, InstanceState.RESUMING)
            or (m.state == InstanceState.READY and not m.drain_requested)
        )

    def running_machines(self) -> int:
        """Machines billing their full price now (a stopped one bills its disk only)."""
        return sum(1 for m in self.live.values() if billing.charge(m.state) is Charge.FULL)

    def _running(self) -> int:
        return sum(len(m.jobs) for m in self.live.values()) + self.handing_back

    def _sample(self) -> None:
        if self.world.metric_lag_s <= 0:
            return
        head = self.pending[0] if self.pending else -1
        self.samples.append((self.now, len(self.pending), head, self._running()))

    def _takes_jobs(self, m: SimMachine) -> bool:
        if m.state != InstanceState.READY or len(m.jobs) >= self.world.worker_concurrency:
            return False
        if m.preempted_s is not None:
            return False  # stopped by its provider: its worker is gone
        # a drain racing a pickup: until the worker stops consuming, it may take a job
        return not m.drain_requested or m.launch_id in self.racing

    def _dispatch(self) -> None:
        while self.pending:
            free = [m for m in self.live.values() if self._takes_jobs(m)]
            if not free:
                break
            m = free[self.rng.randrange(len(free))]
            job = self.pending.popleft()
            m.jobs[job] = self.now
            self.result.starts[job] = self.now
            self._push(self.now + self.jobs[job].runtime_s, _FINISH, f"{m.launch_id}#{job}")
        self._sample()

    def _booted(self, launch_id: str) -> None:
        m = self.machines[launch_id]
        if m.ended_s is not None or m.preempted_s is not None:
            return  # destroyed while booting (a baseline may do that), or preempted
        m.state = InstanceState.READY
        m.ready_s = self.now
        self.boots.append(self.now - m.created_s)
        self.backoffs.pop(m.provider, None)  # a machine came up: its provider works again
        self._dispatch()

    def _rental_failed(self, provider: str, error: str) -> None:
        """A rental from `provider` failed: its own (queue, provider) backoff grows."""
        self.result.failed_rentals += 1
        self.backoffs[provider] = after_failure(
            self.backoffs.get(provider),
            self.queue,
            provider,
            self._at(self.now),
            self.config.backoff,
            error,
        )

    def _finish(self, payload: str) -> None:
        launch_id, _, job_s = payload.rpartition("#")
        job = int(job_s)
        m = self.machines[launch_id]
        started = m.jobs.get(job)
        if started is None or m.ended_s is not None:
            return  # the job was killed with its machine
        if self.now < started + self.jobs[job].runtime_s - 1e-6:
            return  # a stale completion of a killed-and-restarted job
        del m.jobs[job]
        m.last_task_s = self.now
        self.runtimes.append((self.now, self.jobs[job].runtime_s))
        self.runtime_sum += self.jobs[job].runtime_s
        if m.drain_requested and not m.jobs and launch_id not in self.racing:
            self._release(m)
        self._dispatch()

    def _drained(self, launch_id: str) -> None:
        """The race window of a drain closed: the worker consumes no more."""
        self.racing.discard(launch_id)
        m = self.machines[launch_id]
        if m.ended_s is None and m.drain_requested and not m.jobs:
            self._release(m)

    def _release(self, m: SimMachine) -> None:
        """A drained machine: stopped for the warm pool when decide() gave it a place there (and
        the provider can stop), else destroyed."""
        if m.keep_warm and not m.jobs and m.preempted_s is None and self._params(m).can_stop:
            self._stop(m)
        else:
            self._destroy(m, released=True)

    def _destroy(self, m: SimMachine, released: bool = False) -> None:
        for job in sorted(m.jobs, reverse=True):
            # Only a baseline can get here: the job is lost and goes back to the queue.
            self.result.killed += 1
            self.result.starts.pop(job, None)
            self.pending.appendleft(job)
        m.jobs = {}
        m.state = InstanceState.TERMINATED
        self._hand_back(m)
        # a node kept after its worker left (a cluster's scale-in delay) bills on
        m.ended_s = (
            self.now
            + (self.world.release_delay_s if released else 0.0)
            + self.world.destroy_billing_s
        )
        self.live.pop(m.launch_id, None)
        self._sample()

    # ------------------------------------------------------------------ machine events
    _stop = machine_events.stop
    _current = machine_events.current
    _stopped = machine_events.stopped
    _resume = machine_events.resume
    _resumed = machine_events.resumed
    _missed = machine_events.missed
    _reconcile = machine_events.reconcile_round
    _arm_preemption = machine_events.arm_preemption
    _preempted = machine_events.preempted
    _hand_back = machine_events.hand_back
    _handed_back = machine_events.handed_back

    # ------------------------------------------------------------------ policy
    def _at(self, s: float) -> datetime:
        return EPOCH + timedelta(seconds=s)

    def _observed(self) -> tuple[int, float | None, int]:
        """(pending, oldest job's age, running) as the source reports them now."""
        lag = self.world.metric_lag_s
        if lag <= 0 or not self.samples:
            head = self.pending[0] if self.pending else -1
            pending, running, at = len(self.pending), self._running(), self.now
        else:
            i = bisect.bisect_right(self.samples, (self.now - lag, math.inf)) - 1
            at, pending, head, running = self.samples[i] if i >= 0 else (0.0, 0, -1, 0)
        oldest = (at - self.jobs[head].arrival_s) if head >= 0 else None
        return pending, oldest, running

    def snapshot(self) -> Snapshot:
        pending, oldest, running = self._observed()
        live = self._live()
        w = self.world
        metrics = QueueMetrics(
            queue=self.queue,
            pending=pending,
            oldest_pending_age=None if w.blind_age else oldest,
            in_flight=0 if w.blind_in_flight else running,
            read_at=self._at(self.now),
            running=None if w.blind_in_flight else running,
        )
        machines = tuple(
            Machine(
                launch_id=m.launch_id,
                state=m.state,
                created_at=self._at(m.created_s),
                provider=m.provider,
                ready_at=self._at(m.ready_s) if m.ready_s is not None else None,
                running_tasks=len(m.jobs),
                last_task_at=self._at(m.last_task_s) if m.last_task_s is not None else None,
                drain_requested=m.drain_requested,
                launched_for=m.launched_for,
                price_per_hour=m.price,
                spec_key=m.spec_key,
                keep_warm=m.keep_warm,
                stopped_at=self._at(m.stopped_s) if m.stopped_s is not None else None,
                storage_price_per_hour=m.storage_price,
                interruptible=m.interruptible,
            )
            for m in live
        )
        backoffs = tuple(self.backoffs[p] for p in self.auto.providers if p in self.backoffs)
        while self.runtimes and self.runtimes[0][0] < self.now - RUNTIME_WINDOW_S:
            self.runtime_sum -= self.runtimes.popleft()[1]
        self.history = replace(
            observe_load(self.history, pending + running, metrics.read_at),
            job_seconds=max(0.0, self.runtime_sum / len(self.runtimes)) if self.runtimes else None,
            jobs_seen=len(self.runtimes),
        )
        qs = QueueSnapshot(
            self.queue,
            metrics,
            machines,
            0,
            backoffs,
            boot_estimate=max(self.boots) if self.boots else None,
            history=self.history,
        )
        return Snapshot(queues=(qs,))

    def _evaluate(self) -> None:
        self.result.evaluations += 1
        snapshot = self.snapshot() if self.account is None else self.account.snapshot(self.now)
        plan = self.policy(snapshot, self.config, self._at(self.now))
        qp = plan.for_queue(self.queue)
        if qp is None:
            return
        if self.keep_log and (qp.launches or qp.reclaims or qp.drains or qp.resumes):
            self.result.log.append(f"t={self.now:.0f}s\n{plan.describe()}")
        self.result.waits_by_cap += sum(1 for w in qp.waits if w.kind == "spend_cap")
        at = self._at(self.now)
        self.held = frozenset(p for p, b in self.backoffs.items() if active_backoff(b, at))
        execute(plan, _SimActions(self), lambda: "", (self.queue,))
        self.result.peak_machines = max(self.result.peak_machines, self.running_machines())
        self.result.max_over_limit = max(
            self.result.max_over_limit, self._capacity() - self.auto.max_workers
        )
        self._dispatch()

    def _ranked(self, providers: Sequence[str]) -> list[str]:
        """The providers a launch tries, in order: those of `providers` the queue lists and
        that were not in backoff when decide() planned the launch (`held`), ranked by
        `policy.placement.rank` on the queue's rule, one offer per provider (its price, its
        mean boot). A launch naming none of the queue's providers (a `provider` that is the
        queue's whole tuple, as a policy unaware of placement writes it) may rent from any."""
        listed = [p for p in providers if p in self.providers] or list(self.providers)
        open_ = [p for p in listed if p not in self.held]
        if len(open_) <= 1:
            return open_
        gpus = self.auto.instance.gpus
        offers = [Candidate(p, gpus[0], self.providers[p].params.price_per_hour) for p in open_]
        boots = {(p, gpus[0]): self.providers[p].params.boot_s for p in open_}
        ranked = rank(offers, self.auto.placement, self.auto.providers, gpus, boots, DEFAULT_BOOT_S)
        return [c.provider for c in ranked]

    def _launch(
        self, reason: str, providers: Sequence[str] = (), interruptible: bool = False
    ) -> None:
        """Rent one simulated machine (the executor's `launch`, on the virtual providers): the
        ranked offers in turn until one has capacity; `interruptible`: at the queue's bid."""
        self.launch_seq += 1
        for name in self._ranked(providers):
            source = self.providers[name]
            outcome = source.rent(self.now)
            if outcome.rented:
                self._rented(
                    reason,
                    name,
                    source.params,
                    outcome.boot_s,
                    outcome.boots,
                    interruptible and self.bid is not None,
                )
                return
            self._rental_failed(name, outcome.error or "rental failed")

    def _rented(
        self,
        reason: str,
        provider: str,
        params: ProviderParams,
        boot_s: float,
        boots: bool,
        interruptible: bool = False,
    ) -> None:
        launch_id = f"{self.queue}-{self.launch_seq}"
        price = params.price_per_hour
        if interruptible and self.bid is not None:
            price = self.bid.price(price)
        m = SimMachine(
            launch_id,
            self.now,
            price,
            launched_for=reason,
            spec_key=self.spec_key,
            storage_price=params.storage_price_per_hour,
            provider=provider,
            interruptible=interruptible,
        )
        self.machines[launch_id] = m
        self.live[launch_id] = m
        self._arm_preemption(m)
        if boots:
            self._push(self.now + boot_s, _BOOTED, launch_id)
        elif self.world.failure_seen_at_boot:  # the provider lists it dead: reconcile's round
            m.dead_s = self.now + min(boot_s, self.boot_timeout)
        # else its worker never comes up: reconcile's boot timeout

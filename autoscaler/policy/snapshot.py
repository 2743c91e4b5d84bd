"""What the decision core sees: plain frozen data, built by the shell, read by `decide()`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Literal, get_args

from autoscaler.lifecycle import BOOTING_STATES, LIVE_STATES, WARM_STATES, InstanceState
from autoscaler.policy.history import NO_HISTORY, QueueHistory


@dataclass(frozen=True)
class QueueMetrics:
    """One queue's numbers as read by a metrics source at `read_at`, as a person would count them.

    - `pending`: jobs waiting in the broker that are due now (jobs scheduled for later are in
      `scheduled`, where the source can see them: see the README's "Queue metrics").
    - `oldest_pending_age`: seconds the oldest *due* pending job has waited (since its due time
      for a job that had one); None when nothing is pending or the age is unknown. A lower bound
      for unstamped producers.
    - `in_flight`: what the broker itself counts delivered and not acknowledged, due jobs only:
      kombu's `unacked` hash on Redis, `messages_unacknowledged` on RabbitMQ, asynq's active list,
      a stream group's pending entries. With Celery's default early acks these are prefetched
      jobs that have not started (a running job is acked already); with `acks_late` they include
      the running ones. It is NOT the number of running jobs.
    - `running` / `reserved`: jobs running now and jobs prefetched by a worker and not started,
      as the *workers* report them (Celery's `active` / `reserved` through the worker-status port,
      agent heartbeats); None where no worker report exists.
    - `scheduled`: jobs whose due time (ETA / countdown) has not come, waiting in the broker or
      held by a worker; `next_due_at` the earliest due time (epoch seconds); `scheduled_held`:
      how many of them a worker holds (the broker counts those unacked; not in `in_flight`).
    - `paused`: the queue is paused at the source (asynq): its pending jobs are not served.

    Hand-made machines count as capacity through their sightings
    (`QueueSnapshot.manual_workers`), not through these numbers. `stale` is True when the source
    failed and these are the last known numbers; `error` says why (redacted, no secrets).
    `external` holds values of `metric` triggers, keyed by their query string;
    `external_degraded` names the queries whose value is missing or only last-known: the queue's
    own numbers still drive scale-up, but nothing is scaled down while any is degraded.
    """

    queue: str
    pending: int
    oldest_pending_age: float | None
    in_flight: int
    read_at: datetime
    external: tuple[tuple[str, float], ...] = ()
    external_degraded: tuple[str, ...] = ()
    stale: bool = False
    error: str | None = None
    scheduled: int = 0
    next_due_at: float | None = None
    scheduled_held: int = 0
    running: int | None = None
    reserved: int | None = None
    paused: bool = False
    delivered_during_read: int = 0
    """Jobs handed to a worker while the read ran (a Redis read is cut into pieces): each is
    counted in `pending`, or - taken from its list before the list was counted - nowhere.
    Never load (nothing is rented for them); a machine that may hold one is not idle."""

    @property
    def started_or_held(self) -> int:
        """Jobs handed to workers and due: running plus prefetched-not-started.

        Two lower bounds of the same set: the workers' own report (misses a worker that did not
        answer) and the broker's unacked count (misses running jobs under early acks). The
        larger is the better count; without any worker report it is the broker's alone."""
        reported = (self.running or 0) + (self.reserved or 0)
        return max(self.in_flight, reported)


# --------------------------------------------------------------------------- decide() input
#
# Everything below is owned by the decision core. The shell (control/) builds these records from
# the store and the metrics sources; the simulator builds them from its virtual world. They are
# frozen and hold no behaviour beyond small derived readings, so decide() stays a pure function.


@dataclass(frozen=True)
class Machine:
    """One of our machines serving a queue, as the decision core sees it.

    `launched_for` is the audit note of the load it was launched for (trigger and numbers).
    `price_per_hour` is the rented offer's price when known; spend caps fall back to the queue's
    `instance.max_price_per_hour` (an upper bound) when it is None.
    """

    launch_id: str
    state: InstanceState
    created_at: datetime
    provider: str = ""
    ready_at: datetime | None = None
    running_tasks: int = 0
    last_task_at: datetime | None = None
    drain_requested: bool = False
    launched_for: str | None = None
    price_per_hour: float | None = None
    spec_key: str | None = None
    """What it was rented as (`policy.warm.spec_key`): a stopped machine is resumed only for
    the spec a launch would rent now."""
    keep_warm: bool = False
    """Its drain ends in the warm pool (stopped, not destroyed): granted by `decide()`."""
    stopped_at: datetime | None = None
    storage_price_per_hour: float | None = None
    """What it bills while stopped (its kept disks), where the provider says."""
    interruptible: bool = False
    """Rented at a bid (Vast): the provider may stop it whenever it is outbid."""

    @property
    def booting(self) -> bool:
        return self.state in BOOTING_STATES

    @property
    def warm(self) -> bool:
        """In the warm pool: stopping or stopped, disk kept; not capacity."""
        return self.state in WARM_STATES

    @property
    def busy(self) -> bool:
        return self.running_tasks > 0

    @property
    def serving(self) -> bool:
        """Ready, taking jobs, and not asked to leave: live capacity."""
        return self.state == InstanceState.READY and not self.drain_requested

    @property
    def billing(self) -> bool:
        """May exist at the provider and cost money (every live state)."""
        return self.state in LIVE_STATES

    def idle_since(self) -> datetime:
        """When it last ran a task; a worker that never ran one is idle since it became ready."""
        return self.last_task_at or self.ready_at or self.created_at


BackoffCause = Literal["capacity", "no_offer", "auth", "no_answer", "error", "boot"]
"""What failed a rental, as `status` names it: no stock for any offer, no offer under the cap,
the key refused, no answer within the placement's time limit, another error, a boot that failed."""

BACKOFF_CAUSES: tuple[BackoffCause, ...] = get_args(BackoffCause)


@dataclass(frozen=True)
class BackoffState:
    """A (queue, provider) after failed rentals: no launch before `until`."""

    provider: str
    failures: int
    until: datetime
    last_error: str | None = None
    cause: BackoffCause | None = None


HoldCause = Literal["rate_limit", "unanswered"]
"""Why a provider takes no call now: a 429's reset, or no answer within a step's deadline."""


@dataclass(frozen=True)
class RateLimit:
    """A provider held: no call before `until`, because it rate-limited the account (HTTP 429
    with a long reset: `cause` "rate_limit") or gave no answer within a step's deadline
    ("unanswered": it takes connections and says nothing).

    Not a failure of the rental: it does not grow the (queue, provider) backoff, it only holds
    every launch for that provider until the provider's own reset, or its next answer."""

    provider: str
    until: datetime
    reason: str = "rate limited"
    cause: HoldCause = "rate_limit"

    def active(self, now: datetime) -> bool:
        return now < self.until


@dataclass(frozen=True)
class ManualTarget:
    """An operator pinned the queue at `workers` machines until `until` (`autoscaler scale`)."""

    workers: int
    until: datetime
    set_by: str = ""

    def active(self, now: datetime) -> bool:
        return now < self.until


@dataclass(frozen=True)
class QueueSnapshot:
    """One queue: its numbers (None when never read), our machines, hand-made workers, backoffs.

    `manual_workers` counts workers serving the queue that this installation did not rent (the
    GPU under the desk); they count as capacity but are never drained. `boot_estimate` is how
    long a machine of this queue took from decision to ready lately (seconds; None when none has
    booted yet): scheduled jobs are pre-warmed for that long before they fall due.
    `history` is what the queue's past readings and finished jobs taught (`policy.history`).
    """

    name: str
    metrics: QueueMetrics | None
    machines: tuple[Machine, ...] = ()
    manual_workers: int = 0
    backoffs: tuple[BackoffState, ...] = ()
    manual_target: ManualTarget | None = None
    boot_estimate: float | None = None
    history: QueueHistory = NO_HISTORY

    def backoff_for(self, provider: str) -> BackoffState | None:
        for b in self.backoffs:
            if b.provider == provider:
                return b
        return None


@dataclass(frozen=True)
class Billing:
    """What one queue's machines in one state bill, counted by the store rather than listed:
    the queues a sharded evaluation does not hold still count toward the account's caps.
    `known_dollars` sums the known prices ($/h; a stopped machine's storage price), `unpriced`
    counts the machines without one."""

    queue: str
    state: InstanceState
    machines: int
    known_dollars: float = 0.0
    unpriced: int = 0


@dataclass(frozen=True)
class Snapshot:
    """Every queue at one instant. Queues without config still count toward spend caps, and so
    do the machines of queues other shards evaluate (`elsewhere`)."""

    queues: tuple[QueueSnapshot, ...] = ()
    rate_limits: tuple[RateLimit, ...] = ()
    elsewhere: tuple[Billing, ...] = ()

    @cached_property
    def _by_name(self) -> dict[str, QueueSnapshot]:
        return {q.name: q for q in self.queues}

    def rate_limit_for(self, provider: str, now: datetime) -> RateLimit | None:
        """The provider's rate limit in force at `now`, if any."""
        return next((r for r in self.rate_limits if r.provider == provider and r.active(now)), None)

    def queue(self, name: str) -> QueueSnapshot | None:
        """O(1): decide() asks once per queue, so a scan would make it O(queues²)."""
        return self._by_name.get(name)

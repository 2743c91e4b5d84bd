"""A simulated provider: boot time, boot failures, rental (capacity) errors and a price; and, for
warm pools, the stop, the resume and what a stopped machine bills.

What the simulator assumes, and where each number comes from (issue 21 and the providers'
pages; a mock provider's own numbers win where its config sets them):

- COLD_BOOT_S, 3 min from rental to a ready worker: users measure 165 s on RunPod for a 16 GB
  image the host has not cached (the image pull), plus the agent's clone and install; Vast says
  "usually under 5 minutes". A boot varies by ±25 % (`boot_jitter`).
- RESUME_S, 40 s from a start to a ready worker: the same RunPod image starts in 33 s once
  cached on the host, which is what a stopped machine's host has; the agent then skips its
  clone and install (commit and requirements unchanged) and starts the worker (AWS EC2 warm
  pools advertise "as low as 30 seconds"). ±25 % too.
- STOP_S, 30 s from the stop to the machine stopped, billed at the full price meanwhile (as the
  realistic world's 30 s of billing after a destroy; no provider publishes it).
- RESUME_FAILURE_RATE, 10 % of resumes fail (a warm miss: destroyed, a fresh machine rented at
  the next evaluation, no backoff). A guess, not a measurement: RunPod's start comes back with
  zero GPUs when someone rented the host's GPU while the pod was stopped, and Vast's start "is
  subject to resource availability on the machine"; popular GPUs are rented out often, a
  stopped machine's host keeps none for it. A parameter (`resume_failure_rate`) for what a
  provider really does. A RunPod (or mock) miss is seen when the start answers (after about a
  resume time); a Vast one only at `resume_timeout` (its start may wait in `scheduling`
  indefinitely).
- Storage while stopped: RunPod bills a stopped pod's volume $0.20/GB-month (its
  `known_storage_price`: `volume_gb` × `storage_price_per_gb_month`; the instance's disk when no
  volume is declared); Vast hosts set their own storage price, assumed the same $0.20/GB-month
  of the instance's disk. 50 GB → $0.0137/h, 2.3 % of a $0.60/h machine.

Interruptible machines (`instance.interruptible`: a bid, a `max_share`): a launch decide()
marked interruptible rents at the bid (`Interruptible.price` of the provider's on-demand price)
from the same offers, with the same boot and failure numbers (a bid is never refused for being
low: the simulator has no market). While rented, it is preempted — outbid and stopped by the
provider — after an exponential time at `World.preemption_rate` per machine-hour (its own
seeded generator; the rate does not depend on the bid, which in a real market it does):

- its GPU stops billing at once (Vast bills no GPU time for a stopped instance); its disk bills
  on, at its storage price, until reconcile destroys it;
- its worker stops with the jobs it ran; everything else is as production's row says: decide()
  sees a serving machine until reconcile's next round (every poll) reads the provider's
  listing — stopped, outbid — destroys it, hands its jobs back and evaluates the queue
  (`policy.reconcile`, through `sim.reconcile_port`: the simulator applies production's rule);
- the jobs it ran come back HANDBACK_S (5 s) after that round: the hand-back step waits
  `control.steps.handback.GRACE` (5 s) and has RabbitMQ requeue them (the machine's user's
  connections closed: under a second). On Redis nothing the broker keeps says whose a delivery
  is, so they come back by kombu's `visibility_timeout` instead (an hour by default): simulate
  such a queue with `World.handback_s` set to it. Under `acks_late` each runs again from its
  start, first in line, its work so far lost (paid, done again); the broker counts it in flight
  meanwhile, so decide() sees it as running. Under Celery's default early acks the running job
  was acknowledged when it started: it is lost, counted, never run.

Several providers (`autoscale.provider: [a, b]`): one `SimProvider` each, with its own
numbers (a declared mock provider's price, boot, failure rates; any other kind the defaults
above at the queue's price cap) and its own **capacity windows** (`Outage`: from `start_s` to
`end_s` seconds into the trace every rental from it fails with a capacity error, as a sold-out
GPU type does — `simulate --outage PROVIDER@10:00-12:00`). A simulated provider answers a
launch with one offer for the queue's GPU list: one price and one boot distribution whatever
the GPU (see `engine.Simulation._ranked`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from autoscaler.config.models import Autoscale, Config
from autoscaler.config.provider_options import (
    HOURS_PER_MONTH,
    MockOptions,
    ProviderConfig,
    RunPodOptions,
    VastOptions,
)
from autoscaler.control.steps.handback import GRACE

COLD_BOOT_S = 180.0
DEFAULT_BOOT_S = COLD_BOOT_S
RESUME_S = 40.0
STOP_S = 30.0
RESUME_FAILURE_RATE = 0.10
STORAGE_PER_GB_MONTH = 0.20
HANDBACK_S = GRACE.total_seconds()
"""From reconcile destroying a preempted machine to its jobs back in the broker (see above)."""


@dataclass(frozen=True)
class ProviderParams:
    boot_s: float
    boot_failure_rate: float
    capacity_error_rate: float
    price_per_hour: float
    boot_jitter: float = 0.25
    can_stop: bool = True
    stop_s: float = STOP_S
    resume_s: float = RESUME_S
    resume_failure_rate: float = RESUME_FAILURE_RATE
    storage_price_per_hour: float = 0.0
    miss_seen_at_timeout: bool = False
    """A failed resume is seen only at the queue's `resume_timeout` (Vast: stuck scheduling),
    else when the start answers, after about a resume time."""

    @classmethod
    def for_queue(cls, config: Config, auto: Autoscale) -> ProviderParams:
        """The numbers of the queue's first listed provider (`for_provider`)."""
        return cls.for_provider(config, auto, auto.providers[0])

    @classmethod
    def for_provider(cls, config: Config, auto: Autoscale, name: str) -> ProviderParams:
        """Provider `name` renting for `auto`: a declared mock provider's numbers; otherwise
        ~3 min boots at the queue's price cap. The warm pool's numbers: the provider's where
        its config says, else the assumptions above."""
        prov = config.providers.get(name)
        storage = _storage_price(prov, auto)
        if isinstance(prov, MockOptions):
            mine = prov.model_fields_set
            return cls(
                prov.boot_delay,
                prov.boot_failure_rate,
                prov.capacity_error_rate,
                prov.price_per_hour,
                stop_s=prov.stop_delay if "stop_delay" in mine else STOP_S,
                resume_s=prov.start_delay if "start_delay" in mine else RESUME_S,
                resume_failure_rate=(
                    prov.resume_failure_rate
                    if "resume_failure_rate" in mine
                    else RESUME_FAILURE_RATE
                ),
                storage_price_per_hour=(
                    prov.storage_price_per_hour if "storage_price_per_hour" in mine else storage
                ),
            )
        return cls(
            DEFAULT_BOOT_S,
            0.0,
            0.0,
            auto.instance.max_price_per_hour,
            can_stop=prov is None or prov.can_stop,
            storage_price_per_hour=storage,
            miss_seen_at_timeout=isinstance(prov, VastOptions),
        )


def _storage_price(prov: ProviderConfig | None, auto: Autoscale) -> float:
    """$/h a stopped machine of `auto` bills: RunPod's volume price, else the instance's disk
    at STORAGE_PER_GB_MONTH."""
    if isinstance(prov, RunPodOptions) and prov.volume_gb > 0:
        known = prov.known_storage_price(auto.instance)
        if known is not None:
            return known[0]
    return auto.instance.disk_gb * STORAGE_PER_GB_MONTH / HOURS_PER_MONTH


@dataclass(frozen=True)
class RentalOutcome:
    rented: bool
    boot_s: float = 0.0
    boots: bool = True
    error: str | None = None


@dataclass(frozen=True)
class ResumeOutcome:
    ok: bool
    after_s: float
    """Seconds from the start to a ready worker (ok), or to the failure being seen."""
    at_timeout: bool = False
    """A miss with no ready worker by `resume_timeout` (the start answered): seen by reconcile
    (`policy.reconcile`), not by the resume step."""


@dataclass(frozen=True)
class Outage:
    """A capacity window: provider `provider` has no capacity from `start_s` to `end_s`
    (seconds into the trace, end excluded): every rental from it fails with a capacity error.
    Machines it already runs are untouched (resumes too: a stopped machine keeps its host)."""

    provider: str
    start_s: float
    end_s: float

    def covers(self, at: float) -> bool:
        return self.start_s <= at < self.end_s

    def describe(self) -> str:
        return f"{self.provider}@{clock(self.start_s)}-{clock(self.end_s)}"


OUTAGE_FORMS = (
    "PROVIDER@START-END, START and END as hours:minutes[:seconds] into the trace (10:00-12:00; "
    "past 24:00 for the days after the first) or seconds (36000-43200)"
)
_CLOCK = re.compile(r"^([0-9]{1,4}):([0-5][0-9])(?::([0-5][0-9](?:\.[0-9]+)?))?$")
_SECONDS = re.compile(r"^[0-9]+(?:\.[0-9]+)?$")


def clock(seconds: float) -> str:
    """Seconds into the trace as hours:minutes (and seconds when not whole minutes)."""
    whole = round(seconds)
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    return f"{h:02d}:{m:02d}" + (f":{s:02d}" if s else "")


def _time_of(text: str, whole: str) -> float:
    t = text.strip()
    if _SECONDS.match(t):
        return float(t)
    found = _CLOCK.match(t)
    if found is None:
        raise ValueError(f"outage {whole!r}: {t!r} is no time; write {OUTAGE_FORMS}")
    h, m, s = found.groups()
    return int(h) * 3600.0 + int(m) * 60.0 + (float(s) if s else 0.0)


def parse_outage(text: str) -> Outage:
    """`gpu-vast@10:00-12:00` → Outage("gpu-vast", 36000, 43200); ValueError naming the form."""
    provider, at, span = text.rpartition("@")
    start, dash, end = span.partition("-")
    if not at or not provider.strip() or not dash:
        raise ValueError(f"outage {text!r}: write {OUTAGE_FORMS}")
    outage = Outage(provider.strip(), _time_of(start, text), _time_of(end, text))
    if outage.end_s <= outage.start_s:
        raise ValueError(
            f"outage {text!r} ends before it starts; an outage across midnight runs past 24:00 "
            "(23:00-25:00)"
        )
    return outage


class SimProvider:
    def __init__(
        self,
        params: ProviderParams,
        rng: random.Random,
        outages: Sequence[Outage] = (),
    ) -> None:
        self.params = params
        self.rng = rng
        self.outages = tuple(outages)
        """Its capacity windows."""

    def out_of_capacity(self, at: float) -> bool:
        return any(o.covers(at) for o in self.outages)

    def _jitter(self) -> float:
        return 1.0 + self.params.boot_jitter * (2.0 * self.rng.random() - 1.0)

    def rent(self, at: float | None = None) -> RentalOutcome:
        """One rental at `at` seconds into the trace. Inside a capacity window it fails at
        once, drawing nothing from the generator (the rest of the day's draws stay as they
        were without the window)."""
        p = self.params
        if at is not None and self.out_of_capacity(at):
            return RentalOutcome(False, error="no offer available (simulated capacity window)")
        if self.rng.random() < p.capacity_error_rate:
            return RentalOutcome(False, error="no offer available (simulated capacity error)")
        jitter = self._jitter()
        boots = self.rng.random() >= p.boot_failure_rate
        return RentalOutcome(True, boot_s=p.boot_s * jitter, boots=boots)

    def resume(self, resume_timeout: float) -> ResumeOutcome:
        """Start a stopped machine: ready after a resume time, or a warm miss."""
        p = self.params
        after = p.resume_s * self._jitter()
        if self.rng.random() < p.resume_failure_rate:
            if p.miss_seen_at_timeout:
                return ResumeOutcome(False, resume_timeout, at_timeout=True)
            return ResumeOutcome(False, after)
        if after >= resume_timeout:  # no ready worker by resume_timeout: reconcile's miss
            return ResumeOutcome(False, resume_timeout, at_timeout=True)
        return ResumeOutcome(True, after)

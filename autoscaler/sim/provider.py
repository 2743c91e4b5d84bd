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
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from autoscaler.config.models import (
    HOURS_PER_MONTH,
    Autoscale,
    Config,
    MockProvider,
    ProviderConfig,
    RunPodProvider,
    VastProvider,
)

COLD_BOOT_S = 180.0
DEFAULT_BOOT_S = COLD_BOOT_S
RESUME_S = 40.0
STOP_S = 30.0
RESUME_FAILURE_RATE = 0.10
STORAGE_PER_GB_MONTH = 0.20


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
        """A declared mock provider's numbers; otherwise ~3 min boots at the queue's price cap.
        The warm pool's numbers: the provider's where its config says, else the assumptions
        above."""
        prov = config.providers.get(auto.provider)
        storage = _storage_price(prov, auto)
        if isinstance(prov, MockProvider):
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
            miss_seen_at_timeout=isinstance(prov, VastProvider),
        )


def _storage_price(prov: ProviderConfig | None, auto: Autoscale) -> float:
    """$/h a stopped machine of `auto` bills: RunPod's volume price, else the instance's disk
    at STORAGE_PER_GB_MONTH."""
    if isinstance(prov, RunPodProvider) and prov.volume_gb > 0:
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


class SimProvider:
    def __init__(self, params: ProviderParams, rng: random.Random) -> None:
        self.params = params
        self.rng = rng

    def _jitter(self) -> float:
        return 1.0 + self.params.boot_jitter * (2.0 * self.rng.random() - 1.0)

    def rent(self) -> RentalOutcome:
        p = self.params
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
            return ResumeOutcome(False, resume_timeout if p.miss_seen_at_timeout else after)
        if after >= resume_timeout:  # no ready worker by resume_timeout: reconcile's miss
            return ResumeOutcome(False, resume_timeout)
        return ResumeOutcome(True, after)

"""A simulated provider: boot time, boot failures, rental (capacity) errors and a price."""

from __future__ import annotations

import random
from dataclasses import dataclass

from autoscaler.config.models import Autoscale, Config, MockProvider

DEFAULT_BOOT_S = 180.0


@dataclass(frozen=True)
class ProviderParams:
    boot_s: float
    boot_failure_rate: float
    capacity_error_rate: float
    price_per_hour: float
    boot_jitter: float = 0.25

    @classmethod
    def for_queue(cls, config: Config, auto: Autoscale) -> ProviderParams:
        """A declared mock provider's numbers; otherwise ~3 min boots at the queue's price cap."""
        prov = config.providers.get(auto.provider)
        if isinstance(prov, MockProvider):
            return cls(
                prov.boot_delay,
                prov.boot_failure_rate,
                prov.capacity_error_rate,
                prov.price_per_hour,
            )
        return cls(DEFAULT_BOOT_S, 0.0, 0.0, auto.instance.max_price_per_hour)


@dataclass(frozen=True)
class RentalOutcome:
    rented: bool
    boot_s: float = 0.0
    boots: bool = True
    error: str | None = None


class SimProvider:
    def __init__(self, params: ProviderParams, rng: random.Random) -> None:
        self.params = params
        self.rng = rng

    def rent(self) -> RentalOutcome:
        p = self.params
        if self.rng.random() < p.capacity_error_rate:
            return RentalOutcome(False, error="no offer available (simulated capacity error)")
        jitter = 1.0 + p.boot_jitter * (2.0 * self.rng.random() - 1.0)
        boots = self.rng.random() >= p.boot_failure_rate
        return RentalOutcome(True, boot_s=p.boot_s * jitter, boots=boots)

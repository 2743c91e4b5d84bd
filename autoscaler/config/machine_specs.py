"""What machine a queue rents (`instance:`, with its `interruptible:` share) and keeps stopped
(`autoscale.warm_pool:`).

Its own module because the provider options, the triggers and the queue's rules all read these
specs, and none of them should have to import another to get them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from autoscaler.config.durations import Duration
from autoscaler.config.fields import MAX_PRICE_PER_HOUR, MAX_WORKERS, Line, Strict, distinct

DEFAULT_WORKER_IMAGE = "ghcr.io/gpu-queue-autoscaler/worker:latest"

GpuName = Annotated[Line, Field(min_length=1, max_length=100)]


class Interruptible(Strict):
    """Rent part of the queue's machines as interruptible (Vast's bid instances): at `bid` per
    hour per machine — dollars, or a share of the offer's on-demand price ("50%") — and at most
    `max_share` of the queue's machines; the rest on demand. An outbid machine is stopped by
    the provider: reconcile sees it, hands its jobs back, destroys it and rents a replacement."""

    bid: float | str
    max_share: float = Field(default=0.5, gt=0, le=1)

    @field_validator("bid")
    @classmethod
    def _bid(cls, value: float | str) -> float | str:
        if isinstance(value, str):
            text = value.strip()
            number = text[:-1].strip() if text.endswith("%") else None
            try:
                share = float(number) if number is not None and number.isascii() else None
            except ValueError:
                share = None
            if share is None or not 0 < share <= 100:
                raise ValueError(
                    f'bid {value!r} is neither dollars per hour nor a share like "50%" '
                    '(above 0, at most 100); write e.g. 0.30 or "50%"'
                )
            return f"{share:g}%"
        if not 0 < value <= MAX_PRICE_PER_HOUR:
            raise ValueError(f"bid {value} $/h must be above 0 and at most {MAX_PRICE_PER_HOUR:g}")
        return value

    def price(self, on_demand: float) -> float:
        """The bid in dollars per hour for an offer whose on-demand price is `on_demand`."""
        if isinstance(self.bid, str):
            return round(on_demand * float(self.bid[:-1]) / 100, 6)
        return self.bid


class InstanceSpec(Strict):
    """The machine to rent for a queue. `gpu`: one name or several acceptable GPUs in
    preference order (`gpus` reads both forms); names resolve to each provider's identifiers
    through `config.gpus`."""

    gpu: GpuName | tuple[GpuName, ...]
    gpu_count: int = Field(default=1, ge=1, le=16)
    disk_gb: int = Field(default=50, ge=1, le=100_000)
    max_price_per_hour: float = Field(gt=0, le=MAX_PRICE_PER_HOUR)
    image: Line = Field(default=DEFAULT_WORKER_IMAGE, min_length=1)
    interruptible: Interruptible | None = None
    """Part of the machines rented interruptible (Vast bids): off when absent."""

    @field_validator("gpu")
    @classmethod
    def _gpu_list(cls, value: str | tuple[str, ...]) -> str | tuple[str, ...]:
        return value if isinstance(value, str) else distinct(value, "GPUs")

    @model_validator(mode="after")
    def _bid_under_the_cap(self) -> InstanceSpec:
        bid = self.interruptible.bid if self.interruptible is not None else None
        if isinstance(bid, float | int) and bid > self.max_price_per_hour:
            raise ValueError(
                f"interruptible.bid ({bid:g} $/h) is above max_price_per_hour "
                f"({self.max_price_per_hour:g}): no offer could be rented at it; lower the bid"
            )
        return self

    @property
    def gpus(self) -> tuple[str, ...]:
        """The acceptable GPUs, in preference order."""
        return (self.gpu,) if isinstance(self.gpu, str) else self.gpu


class WarmPool(Strict):
    """Stopped machines kept for a queue (`autoscale.warm_pool`): an idle machine, once drained,
    is stopped with its disk kept instead of destroyed, and a later launch resumes it (the
    provider's start plus the worker's start) instead of renting cold. Off at `size: 0`."""

    size: int = Field(default=0, ge=0, le=MAX_WORKERS)
    """At most this many stopped machines kept for the queue."""
    keep_for: Duration = Field(default=86400.0, gt=0)
    """A machine stopped this long is destroyed."""
    resume_timeout: Duration = Field(default=120.0, gt=0)
    """A resumed machine without a ready worker by then is destroyed (a warm miss), and a fresh
    one is rented at once."""

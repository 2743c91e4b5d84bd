"""One queue's evaluation, shared by `decide` (which builds it) and `scale_down` (whose
methods read it): the queue's numbers, what it asks for, and which of its providers wait."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from autoscaler.config.models import Autoscale, QueueSettings
from autoscaler.policy.backoff import active_backoff
from autoscaler.policy.plan import Wait, WaitKind
from autoscaler.policy.snapshot import Machine, ManualTarget, QueueSnapshot, Snapshot


@dataclass(frozen=True)
class QueueEval:
    """One queue's evaluation after its scale-up half (before backoff and caps): what the
    scale-down methods and the plan's last step read."""

    name: str
    auto: Autoscale
    settings: QueueSettings
    qs: QueueSnapshot
    capacity: int
    floor: int
    desired: int
    reclaims: tuple[Machine, ...]
    wanted: int
    trigger: str
    reason: str
    up_fired: bool
    fresh: bool
    degraded: tuple[str, ...]
    notes: tuple[str, ...]
    waits: tuple[Wait, ...]
    manual: ManualTarget | None = None
    keep_one: bool = False
    holds: tuple[ProviderHold, ...] = ()
    """Its providers that are not called to rent now, in the order written."""
    resumable: tuple[Machine, ...] = ()
    """Stopped machines of its warm pool a launch may resume, the most recently stopped first
    (none on a provider under a rate limit: a start is a call too)."""

    @property
    def open_providers(self) -> tuple[str, ...]:
        """Its providers that may be called to rent now, in the order written."""
        held = {h.provider for h in self.holds}
        return tuple(p for p in self.auto.providers if p not in held)


@dataclass(frozen=True)
class ProviderHold:
    """A provider of the queue not called to rent now: a hold (a 429's reset, or no answer
    within a step's deadline; it holds resumes too) or the (queue, provider) backoff after
    failed rentals."""

    provider: str
    kind: WaitKind
    until: datetime
    why: str


def provider_holds(
    auto: Autoscale, qs: QueueSnapshot, snapshot: Snapshot, now: datetime
) -> tuple[ProviderHold, ...]:
    holds = []
    for provider in auto.providers:
        limit = snapshot.rate_limit_for(provider, now)
        b = active_backoff(qs.backoff_for(provider), now)
        if limit is not None:
            left = (limit.until - now).total_seconds()
            what = "rate limit" if limit.cause == "rate_limit" else "no answer"
            why = (
                f"{what}: {provider} takes no calls before {limit.until.isoformat()} "
                f"({left:.0f}s left; {limit.reason})"
            )
            holds.append(ProviderHold(provider, limit.cause, limit.until, why))
        elif b is not None:
            left = (b.until - now).total_seconds()
            err = f" (last error: {b.last_error})" if b.last_error else ""
            why = (
                f"backoff: renting from {provider} failed {b.failures} time(s){err}; no "
                f"launch before {b.until.isoformat()} ({left:.0f}s left)"
            )
            holds.append(ProviderHold(provider, "backoff", b.until, why))
    return tuple(holds)

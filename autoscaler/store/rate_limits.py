"""Providers' rate limits: "no call to this provider before T", shared by every process.

A provider that answers 429 with a reset longer than a call may wait (`providers.http`) is
recorded here, so every Celery worker and the next tick honour the reset instead of calling
again: launches for it wait (`Wait(kind="rate_limit")`), reconcile skips its list, terminate
waits. Keyed by the provider's configured name; a later reset extends, never shortens.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from autoscaler.policy.snapshot import RateLimit
from autoscaler.store.models import ProviderRateLimit


def record(session: Session, provider: str, until: datetime, reason: str, now: datetime) -> bool:
    """No call to `provider` before `until` (extends an earlier limit, never shortens it).
    True when this starts a new stretch of limits (none was in force): worth an event."""
    row = session.get(ProviderRateLimit, provider, with_for_update=True)
    if row is None:
        try:
            with session.begin_nested():
                session.add(
                    ProviderRateLimit(
                        provider=provider, until=until, reason=reason[:2000], since=now
                    )
                )
            return True
        except IntegrityError:  # another process inserted it first
            row = session.get(ProviderRateLimit, provider, populate_existing=True)
            if row is None:  # pragma: no cover - deleted in between
                return False
    new = row.until <= now
    if new:  # an expired limit renewed: a new stretch starts now
        row.since = now
    if row.until < until:
        row.until, row.reason = until, reason[:2000]
    session.flush()
    return new


def active(session: Session, now: datetime) -> tuple[RateLimit, ...]:
    """Limits still in force at `now` (one SELECT: the tick reads it every evaluation; expired
    rows are removed when a provider is limited again, or by `purge_expired`)."""
    return tuple(
        RateLimit(r.provider, r.until, r.reason or "rate limited")
        for r in session.scalars(
            select(ProviderRateLimit)
            .where(ProviderRateLimit.until > now)
            .order_by(ProviderRateLimit.provider)
        )
    )


def purge_expired(session: Session, now: datetime) -> int:
    """Forget every limit whose reset has passed; returns how many."""
    result = session.execute(delete(ProviderRateLimit).where(ProviderRateLimit.until <= now))
    return int(getattr(result, "rowcount", 0) or 0)


def of(session: Session, provider: str, now: datetime) -> RateLimit | None:
    """The limit in force for `provider` at `now`, if any."""
    row = session.get(ProviderRateLimit, provider)
    if row is None or row.until <= now:
        return None
    return RateLimit(row.provider, row.until, row.reason or "rate limited")

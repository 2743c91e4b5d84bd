"""Providers held: "no call to this provider before T", shared by every process.

A provider that answers 429 with a reset longer than a call may wait (`providers.http`) is
recorded here (cause `rate_limit`), so every Celery worker and the next tick honour the reset
instead of calling again: launches for it wait (`Wait(kind="rate_limit")`), reconcile skips its
list, terminate waits. A provider that gave no answer within a step's deadline is recorded the
same way (cause `unanswered`, `Wait(kind="unanswered")`), and lifted by its next answered list
(`lift`). Keyed by the provider's configured name; a later hold extends, never shortens.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from autoscaler.policy.snapshot import HoldCause, RateLimit
from autoscaler.store.models import ProviderRateLimit


def record(
    session: Session,
    provider: str,
    until: datetime,
    reason: str,
    now: datetime,
    cause: HoldCause = "rate_limit",
) -> bool:
    """No call to `provider` before `until` (extends an earlier hold, never shortens it; the
    hold that reaches furthest names the cause). True when this starts a new stretch of holds
    (none was in force): worth an event."""
    row = session.get(ProviderRateLimit, provider, with_for_update=True)
    if row is None:
        try:
            with session.begin_nested():
                session.add(
                    ProviderRateLimit(
                        provider=provider,
                        until=until,
                        reason=reason[:2000],
                        since=now,
                        cause=cause,
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
    if row.until < until or new:
        row.until, row.reason, row.cause = until, reason[:2000], cause
    session.flush()
    return new


def lift(session: Session, provider: str, cause: HoldCause, now: datetime) -> bool:
    """End `provider`'s hold of `cause` now (an unanswered provider answered); a hold of the
    other cause stays. True when one was in force."""
    result = session.execute(
        delete(ProviderRateLimit).where(
            ProviderRateLimit.provider == provider,
            ProviderRateLimit.cause == cause,
            ProviderRateLimit.until > now,
        )
    )
    return bool(getattr(result, "rowcount", 0))


def _limit(row: ProviderRateLimit) -> RateLimit:
    cause: HoldCause = "unanswered" if row.cause == "unanswered" else "rate_limit"
    return RateLimit(row.provider, row.until, row.reason or "rate limited", cause)


def active(session: Session, now: datetime) -> tuple[RateLimit, ...]:
    """Limits still in force at `now` (one SELECT: the tick reads it every evaluation; expired
    rows are removed by `store.retention`)."""
    return tuple(
        _limit(r)
        for r in session.scalars(
            select(ProviderRateLimit)
            .where(ProviderRateLimit.until > now)
            .order_by(ProviderRateLimit.provider)
        )
    )


def of(session: Session, provider: str, now: datetime) -> RateLimit | None:
    """The limit in force for `provider` at `now`, if any."""
    row = session.get(ProviderRateLimit, provider)
    if row is None or row.until <= now:
        return None
    return _limit(row)

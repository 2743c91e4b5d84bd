"""Rental backoffs per (queue, provider): read for every evaluation, locked and written when a
rental fails (how long the backoff grows is `policy.backoff`'s, applied by `control.machines`),
cleared when one succeeds. They survive restarts."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from autoscaler.policy.snapshot import BACKOFF_CAUSES, BackoffCause, BackoffState
from autoscaler.store.models import RentalBackoff


def _cause(value: str | None) -> BackoffCause | None:
    return next((c for c in BACKOFF_CAUSES if c == value), None)


def by_queue(session: Session) -> dict[str, tuple[BackoffState, ...]]:
    """Every backoff, per queue (one query)."""
    out: dict[str, list[BackoffState]] = defaultdict(list)
    for b in session.scalars(select(RentalBackoff)):
        out[b.queue].append(
            BackoffState(b.provider, b.failures, b.until, b.last_error, _cause(b.cause))
        )
    return {q: tuple(bs) for q, bs in out.items()}


def locked(session: Session, queue: str, provider: str) -> BackoffState | None:
    """The (queue, provider) backoff, its row locked until the transaction ends (two failures
    at once count twice), or None. Its cause is left out: the next failure says its own."""
    row = session.get(RentalBackoff, (queue, provider), with_for_update=True)
    return BackoffState(provider, row.failures, row.until, row.last_error) if row else None


def write(session: Session, queue: str, state: BackoffState, cause: BackoffCause) -> None:
    """The (queue, provider) backoff is now `state`, failed for `cause` (read with `locked` in
    the same transaction first)."""
    row = session.get(RentalBackoff, (queue, state.provider))
    if row is None:
        session.add(
            RentalBackoff(
                queue=queue,
                provider=state.provider,
                failures=state.failures,
                until=state.until,
                last_error=state.last_error,
                cause=cause,
            )
        )
    else:
        row.failures, row.until, row.last_error = state.failures, state.until, state.last_error
        row.cause = cause
    session.flush()


def clear(session: Session, queue: str, provider: str) -> None:
    session.execute(
        delete(RentalBackoff).where(
            RentalBackoff.queue == queue, RentalBackoff.provider == provider
        )
    )


__all__ = ["by_queue", "clear", "locked", "write"]

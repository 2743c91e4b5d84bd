"""Each reporter's budget for what its heartbeats write (`policy.reports`), kept per reporter.

The budget row is locked while one report spends it, so two heartbeats of the same machine at
once cannot both spend the same credit; it is a row of its own, not the machine's instance row,
so the lock holds up only that machine's own reports, never reconcile or the tick. Rows are
forgotten a day after their last report (a few at each new reporter's first report).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from autoscaler.policy import reports
from autoscaler.store.db import upsert
from autoscaler.store.models import ReportBudget

FORGET_AFTER = timedelta(days=1)
FORGET_BATCH = 1000

_FIELDS = ("jobs", "events", "at", "day", "today", "dropped_jobs", "dropped_events", "told_at")


def spend(session: Session, reporter: str, want: reports.Want, now: datetime) -> reports.Grant:
    """What `reporter`'s report may write now; its budget spent by that. A report that writes
    nothing (most heartbeats) touches no budget: no statement."""
    if want.jobs <= 0 and want.events <= 0:
        return reports.Grant(jobs=0, events=0)
    start = reports.fresh(now)
    created = upsert(
        session,
        ReportBudget,
        [{"reporter": reporter, **{f: getattr(start, f) for f in _FIELDS}}],
        key=("reporter",),
        returning=("reporter",),
    )
    if created:  # a new reporter: forget a batch of those long silent
        _forget_stale(session, now)
    row = session.scalars(
        select(ReportBudget).where(ReportBudget.reporter == reporter).with_for_update()
    ).one()
    budget = reports.Budget(**{f: getattr(row, f) for f in _FIELDS})
    granted, after = reports.grant(budget, want, now)
    for f in _FIELDS:
        setattr(row, f, getattr(after, f))
    session.flush()
    return granted


def _forget_stale(session: Session, now: datetime) -> None:
    stale = (
        select(ReportBudget.reporter)
        .where(ReportBudget.at < now - FORGET_AFTER)
        .limit(FORGET_BATCH)
        .scalar_subquery()
    )
    session.execute(delete(ReportBudget).where(ReportBudget.reporter.in_(stale)))


__all__ = ["spend"]

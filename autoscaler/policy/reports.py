"""How much one machine's reports may write: what it could have done, not what it says.

A machine's heartbeats carry its finished jobs and its events (registered, crashed). Taken at
their word, one hostile machine wrote 400,000 finished jobs in 20 s (its queue's mean runtime
and `trace export` became its word) and 2,051 `crashed` events in 8 s (the newest 50 events of
`autoscaler events` were all its) (issue 33). Each reporter (a rented machine's launch id, a
hand-made machine's key and name) has a budget, refilled with time:

- **finished jobs**: `1 + running` a second (a job holds a worker slot for at least a second;
  `running` is what it says it runs now, counted up to `MAX_RUNNING`; the one is for a slot
  that finished and is idle now), banked up to `JOB_BURST` (one heartbeat's most), and at most
  `JOBS_PER_DAY` in one UTC day. An honest worker of 4 slots finishing a job a second each
  reports about 40 per 10 s heartbeat: well inside;
- **events**: `EVENT_BURST` banked, `EVENTS_PER_HOUR` refilled (its registrations and crash
  reports; a crash loop says so once a minute at most anyway);
- what is past the budget is dropped, counted, and said in one event at most every
  `TELL_EVERY` (`reports_dropped`), so the operator sees a machine that over-reports.

Pure: `grant(budget, want, now)` returns what may be written and the budget after.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

JOB_BURST = 1000
"""Finished jobs banked: one heartbeat carries at most 1,000."""
JOBS_PER_SLOT_S = 1.0
MAX_RUNNING = 64
"""Running jobs a machine's word is believed up to, for its refill."""
JOBS_PER_DAY = 50_000
EVENT_BURST = 30
EVENTS_PER_HOUR = 30
TELL_EVERY = timedelta(minutes=10)
BANK_AT_MOST = timedelta(hours=1)
"""A silence longer than this refills no more than an hour's worth (the caps bound it anyway)."""


@dataclass(frozen=True)
class Budget:
    """One reporter's budget as stored (`store.report_budgets`)."""

    jobs: float
    events: float
    at: datetime
    day: str
    today: int = 0
    dropped_jobs: int = 0
    dropped_events: int = 0
    told_at: datetime | None = None


@dataclass(frozen=True)
class Want:
    jobs: int = 0
    events: int = 0
    running: int = 0


@dataclass(frozen=True)
class Grant:
    jobs: int
    events: int
    tell: str | None = None
    """What to say about what was dropped (an event's reason), when it is time to say it."""


def fresh(now: datetime) -> Budget:
    return Budget(jobs=JOB_BURST, events=EVENT_BURST, at=now, day=now.date().isoformat())


def grant(budget: Budget | None, want: Want, now: datetime) -> tuple[Grant, Budget]:
    b = refilled(budget or fresh(now), want.running, now)
    jobs = max(0, min(want.jobs, math.floor(b.jobs), JOBS_PER_DAY - b.today))
    events = max(0, min(want.events, math.floor(b.events)))
    b = replace(
        b,
        jobs=b.jobs - jobs,
        events=b.events - events,
        today=b.today + jobs,
        dropped_jobs=b.dropped_jobs + want.jobs - jobs,
        dropped_events=b.dropped_events + want.events - events,
    )
    tell = None
    due = b.told_at is None or now - b.told_at >= TELL_EVERY
    if (b.dropped_jobs or b.dropped_events) and due:
        tell = told(b)
        b = replace(b, dropped_jobs=0, dropped_events=0, told_at=now)
    return Grant(jobs, events, tell), b


def refilled(b: Budget, running: int, now: datetime) -> Budget:
    span = min(max((now - b.at).total_seconds(), 0.0), BANK_AT_MOST.total_seconds())
    slots = 1 + min(max(running, 0), MAX_RUNNING)
    day = now.date().isoformat()
    return replace(
        b,
        jobs=min(JOB_BURST, b.jobs + span * slots * JOBS_PER_SLOT_S),
        events=min(EVENT_BURST, b.events + span * EVENTS_PER_HOUR / 3600),
        at=max(b.at, now),
        day=day,
        today=b.today if day == b.day else 0,
    )


def told(b: Budget) -> str:
    parts = []
    if b.dropped_jobs:
        parts.append(
            f"{b.dropped_jobs} finished jobs past what it could have run (1 + its running "
            f"jobs a second, {JOBS_PER_DAY:,} a day)"
        )
    if b.dropped_events:
        parts.append(f"{b.dropped_events} events past {EVENTS_PER_HOUR} an hour")
    return "its reports were cut: dropped " + " and ".join(parts)


__all__ = ["Budget", "Grant", "Want", "fresh", "grant", "refilled"]

"""Money as the operator views read it: what one machine bills now and has billed, and what
the account spends now and spent today.

By the one rule of `policy.billing`: a machine bills from the moment the provider created it
(its move to `booting`; a row still `pending` or `creating` has no machine yet) until it was
terminated, lost or failed (or now, if it may still bill), at its **real** price
(`instances.price_per_hour`: the price the provider reported for the machine, else the offer's),
never the queue's cap. A machine of unknown price adds nothing to a sum and is counted in
`unknown_price` instead. "Today" is the UTC day.

A warm pool's machine bills its running price until it is `stopped` (`stopping` and `resuming`
bill the full price), and while `stopped` only its storage price
(`instances.storage_price_per_hour`, 0 when unknown), until it left that state (resumed,
destroyed, lost) or now.

What changed (issue 35): the bill is read from each machine's state history
(`instance_transitions`, `store/transitions.py`: one row per move), not from the row's one
timestamp per state. The row keeps the times of its latest stop only, so a machine stopped and
resumed twice used to be billed its full price for its earlier stops; every stop now counts at
the storage price, exactly. A row without a history of its own (written before the history
existed and not backfilled, or written directly) is billed from its columns as before. One more
query per view that bills (the histories of the machines it read), still a fixed number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from autoscaler.lifecycle import LIVE_STATES
from autoscaler.policy import billing
from autoscaler.store import transitions
from autoscaler.store.models import Instance


@dataclass(frozen=True)
class Spend:
    rate_per_hour: float
    """Σ real price of every machine that may still bill (a stopped one: its storage price)."""
    today: float
    """What every machine billed since 00:00 UTC today, up to now (stopped time at the storage
    price)."""
    unknown_price: int
    """Machines that may bill and whose price is unknown (not in the sums)."""
    day_start: datetime

    def as_json(self) -> dict[str, Any]:
        return {
            "rate_per_hour": round(self.rate_per_hour, 6),
            "today": round(self.today, 6),
            "unknown_price": self.unknown_price,
            "day_start": self.day_start.isoformat(),
        }


Histories = Mapping[str, Sequence[transitions.StateChange]]
"""Launch id -> its moves (`transitions.history`)."""


def life(row: Instance, histories: Histories | None = None) -> list[billing.Interval[datetime]]:
    """The machine of `row` as the money rule reads it: its intervals (state, from, to), from
    its history in `histories`, or from its columns when it has none there."""
    return transitions.intervals(row, histories or {})


def current_rate(row: Instance) -> float | None:
    """What the machine of `row` bills per hour now (`billing.rate`): its storage price while
    stopped (0 when unknown), else its price (None when unknown). A row that bills nothing (no
    machine yet, or ended) shows its price, as it always did."""
    if billing.charge(row.state) is billing.Charge.NONE:
        return row.price_per_hour
    return billing.rate(row.state, row.price_per_hour, row.storage_price_per_hour)


def billed(
    row: Instance,
    now: datetime,
    since: datetime | None = None,
    histories: Histories | None = None,
) -> tuple[float, float | None]:
    """(Seconds billed, dollars billed) by the machine of `row` from `since` (or its create)
    to now (`billing.bill` over its `life`): its running time at its price, every stopped
    time at its storage price (0 when unknown). Dollars None when it ran for a price that is
    unknown."""
    bill = billing.bill(
        life(row, histories),
        row.price_per_hour,
        row.storage_price_per_hour,
        until=now,
        since=since,
    )
    return bill.seconds, bill.dollars


def day_start(now: datetime) -> datetime:
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


def spend(session: Session, now: datetime) -> Spend:
    """Spend rate now and what was billed today (two queries: rows that may bill or billed
    today, and their histories)."""
    start = day_start(now)
    billing_today = or_(
        Instance.state.in_(LIVE_STATES),
        Instance.terminated_at >= start,
        Instance.lost_at >= start,
        Instance.failed_at >= start,
        Instance.updated_at >= start,
    )
    rows = list(session.scalars(select(Instance).where(billing_today)))
    histories = transitions.history(session, select(Instance.launch_id).where(billing_today))
    rate = today = 0.0
    unknown = 0
    for row in rows:
        live = row.state in LIVE_STATES and row.booting_at is not None
        now_rate = current_rate(row)
        if now_rate is None:
            unknown += 1 if live else 0
            continue
        if live:
            rate += now_rate
        _, dollars = billed(row, now, since=start, histories=histories)
        today += dollars or 0.0
    return Spend(rate, today, unknown, start)


__all__ = ["Histories", "Spend", "billed", "current_rate", "day_start", "life", "spend"]

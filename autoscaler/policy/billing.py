"""The money rule: which state of a machine bills what, and what a machine billed. Pure.

One rule for everything that counts money: the store's views (`status`, the dashboard: what a
machine cost, what the account spends per hour and today), the spend caps (`policy/caps.py`:
what the account's machines may bill now) and the simulator (`sim/engine.py`).

What each state bills (`CHARGES`):

- **its price** (`Charge.FULL`: the machine's real `price_per_hour`): `booting`, `ready`,
  `draining`, `drained`, `stopping`, `resuming` and `terminating` - a machine exists at the
  provider with its GPU (being stopped, started again or destroyed is still billed in full);
- **its storage price only** (`Charge.STORAGE`: `storage_price_per_hour`, 0 when unknown):
  `stopped`, a warm pool's machine with its disk kept and no GPU;
- **nothing** (`Charge.NONE`): `pending` and `creating` (no machine yet: its create has not
  answered) and, after its end, `terminated`, `failed` and `lost`.

A machine's life is its moves in order, read as intervals (state, from, to) (`intervals`): it
bills from its create at the provider (its move to `booting`) to its end (its move to a final
state), and what it billed over a window is the sum over its intervals of their overlap with the
window, each at its state's price (`bill`). Every stop counts at the storage price, however many
times the machine was stopped and resumed.

A spend cap counts what a machine *may* bill (`committed`): what its state bills, except that a
machine whose create may be in flight (`pending`, `creating`) counts at its full price - it may
start billing at any moment.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Generic, TypeVar

from autoscaler.lifecycle import InstanceState

S = InstanceState

Instant = TypeVar("Instant", datetime, float)
"""A moment: an aware datetime (the store) or seconds on a virtual clock (the simulator)."""


class Charge(enum.StrEnum):
    """What a state bills per hour."""

    FULL = "full"
    """The machine's price."""
    STORAGE = "storage"
    """Its storage price only (0 when unknown)."""
    NONE = "none"
    """Nothing."""


CHARGES: Mapping[InstanceState, Charge] = MappingProxyType(
    {
        S.PENDING: Charge.NONE,
        S.CREATING: Charge.NONE,
        S.BOOTING: Charge.FULL,
        S.READY: Charge.FULL,
        S.DRAINING: Charge.FULL,
        S.DRAINED: Charge.FULL,
        S.STOPPING: Charge.FULL,
        S.STOPPED: Charge.STORAGE,
        S.RESUMING: Charge.FULL,
        S.TERMINATING: Charge.FULL,
        S.TERMINATED: Charge.NONE,
        S.FAILED: Charge.NONE,
        S.LOST: Charge.NONE,
    }
)
"""What each state of the lifecycle bills (every state says)."""

IN_FLIGHT = frozenset({S.PENDING, S.CREATING})
"""No machine yet, but its create may be answered at any moment: a cap counts it in full."""


def charge(state: InstanceState) -> Charge:
    """What a machine in `state` bills."""
    return CHARGES[state]


def committed(state: InstanceState) -> Charge:
    """What a spend cap counts for a machine in `state`: what it bills, a machine whose create
    may be in flight (pending, creating) at its full price."""
    return Charge.FULL if state in IN_FLIGHT else CHARGES[state]


def rate(state: InstanceState, price: float | None, storage_price: float | None) -> float | None:
    """$/hour a machine in `state` bills now: its price (None when unknown), its storage price
    (0 when unknown) while stopped, or 0."""
    c = CHARGES[state]
    if c is Charge.FULL:
        return price
    if c is Charge.STORAGE:
        return storage_price or 0.0
    return 0.0


@dataclass(frozen=True)
class Interval(Generic[Instant]):
    """A machine was in `state` from `start` to `end` (None: it still is)."""

    state: InstanceState
    start: Instant
    end: Instant | None = None


def intervals(moves: Iterable[tuple[InstanceState, Instant]]) -> list[Interval[Instant]]:
    """The intervals of a machine's moves (state entered, when), in the order made: each state
    lasts until the next move, the last one is open. Monotone: a move timed before the one it
    follows (two clocks) is taken at that one's time."""
    out: list[Interval[Instant]] = []
    for state, at in moves:
        if out:
            prev = out[-1]
            at = max(at, prev.start)
            out[-1] = Interval(prev.state, prev.start, at)
        out.append(Interval(state, at))
    return out


@dataclass(frozen=True)
class Span(Generic[Instant]):
    """A stretch of a machine's life at one charge (adjacent intervals of one charge joined)."""

    charge: Charge
    start: Instant
    end: Instant


def _seconds(a: Instant, b: Instant) -> float:
    d = b - a
    return d.total_seconds() if isinstance(d, timedelta) else float(d)


def spans(
    life: Sequence[Interval[Instant]], until: Instant, since: Instant | None = None
) -> list[Span[Instant]]:
    """The billing stretches of `life` within [`since`, `until`], in order: adjacent intervals of
    one charge are joined (a machine booting then ready bills one stretch at its price), each is
    cut to the window (an open one runs to `until`), those of no charge and the empty ones are
    left out."""
    joined: list[Span[Instant]] = []
    for i in life:
        c = CHARGES[i.state]
        end = until if i.end is None else i.end
        if joined and joined[-1].charge is c:
            joined[-1] = Span(c, joined[-1].start, end)
        else:
            joined.append(Span(c, i.start, end))
    out: list[Span[Instant]] = []
    for s in joined:
        if s.charge is Charge.NONE:
            continue
        lo = s.start if since is None else max(s.start, since)
        hi = min(s.end, until)
        if hi > lo:
            out.append(Span(s.charge, lo, hi))
    return out


@dataclass(frozen=True)
class Bill:
    """What a machine billed over a window."""

    full_seconds: float
    """Seconds at its price."""
    storage_seconds: float
    """Seconds at its storage price (stopped)."""
    dollars: float | None
    """Their cost; None when its price is unknown and some of it may be at that price."""

    @property
    def seconds(self) -> float:
        """Its create-to-end span within the window: every second it billed anything."""
        return self.full_seconds + self.storage_seconds


def bill(
    life: Sequence[Interval[Instant]],
    price: float | None,
    storage_price: float | None,
    until: Instant,
    since: Instant | None = None,
) -> Bill:
    """What the machine of `life` billed from `since` (or its create) to `until`: its seconds at
    its price, its stopped seconds at its storage price (0 when unknown). Dollars None when its
    price is unknown and any of it may be at that price: a second at full price in the window,
    or a machine that was created and never stopped (its every moment bills that price)."""
    full = storage = 0.0
    for s in spans(life, until, since):
        if s.charge is Charge.FULL:
            full += _seconds(s.start, s.end)
        else:
            storage += _seconds(s.start, s.end)
    if price is None:
        ran = any(CHARGES[i.state] is Charge.FULL for i in life)
        stopped = any(CHARGES[i.state] is Charge.STORAGE for i in life)
        if full > 0 or (ran and not stopped):
            return Bill(full, storage, None)
    dollars = (storage_price or 0.0) * storage / 3600.0 + (price or 0.0) * full / 3600.0
    return Bill(full, storage, dollars)


__all__ = [
    "CHARGES",
    "IN_FLIGHT",
    "Bill",
    "Charge",
    "Instant",
    "Interval",
    "Span",
    "bill",
    "charge",
    "committed",
    "intervals",
    "rate",
    "spans",
]

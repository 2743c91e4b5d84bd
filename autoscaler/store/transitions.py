"""Each machine's state history (`instance_transitions`): one row per move of its instance row.

An instance row keeps one timestamp per state (`stopped_at`, `resuming_at`, ...): the latest
visit of each, so a machine stopped and resumed twice had its first stop billed at its full
price. The history keeps every move, written by the store's state writes (`record`: an intent's
birth, every `move` and `move_many`) in the same transaction as the move itself, so a move and
its history row are committed together or not at all.

Read back (`history`, one query for any number of machines) as the intervals (state, from, to)
the money rule bills (`policy.billing`, `intervals`). A row with no history of its own (written
before the table existed and not backfilled, or written directly, as tests do) reads from its
columns, as well as they can say (`from_columns`, the same rule as the migration's backfill).

Kept as long as its instance row is (`store/retention.py`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Select, insert, select
from sqlalchemy.orm import Session

from autoscaler.lifecycle import FINAL_STATES, InstanceState
from autoscaler.policy import billing
from autoscaler.store.models import Instance, InstanceTransition

T = InstanceTransition

Move = tuple[InstanceState, datetime]
"""A state entered, and when."""


class StateChange(NamedTuple):
    """One move of a machine's row: from `src` (None: its first state) to `dst`, at `at`."""

    src: InstanceState | None
    dst: InstanceState
    at: datetime


# --------------------------------------------------------------------------- writes


def record(
    session: Session,
    launch_ids: Collection[str],
    src: InstanceState | Sequence[InstanceState] | None,
    dst: InstanceState,
    now: datetime,
) -> None:
    """The moves just made of `launch_ids` from `src` to `dst` at `now`, in the caller's
    transaction (call it only for the rows that moved). `src` None: the rows' first state;
    several: the state each row's previous history row entered (the one the move left: moves of
    one row are serialised by the conditional write on its state). One statement."""
    if not launch_ids:
        return
    sources = (src,) if src is None or isinstance(src, InstanceState) else tuple(src)
    if len(sources) == 1:
        session.execute(
            insert(T),
            [{"launch_id": lid, "src": sources[0], "dst": dst, "at": now} for lid in launch_ids],
        )
        return
    for lid in launch_ids:
        left = (
            select(T.dst).where(T.launch_id == lid).order_by(T.id.desc()).limit(1)
        ).scalar_subquery()
        session.execute(insert(T).values(launch_id=lid, src=left, dst=dst, at=now))


# --------------------------------------------------------------------------- reads


def history(
    session: Session, launch_ids: Collection[str] | Select[Any]
) -> dict[str, list[StateChange]]:
    """Launch id -> its moves in the order made, for `launch_ids` (a collection, or a SELECT of
    launch ids). One query."""
    if not isinstance(launch_ids, Select):
        if not launch_ids:
            return {}
        launch_ids = list(launch_ids)
    rows = session.execute(
        select(T.launch_id, T.src, T.dst, T.at)
        .where(T.launch_id.in_(launch_ids))
        .order_by(T.launch_id, T.id)
    )
    out: dict[str, list[StateChange]] = {}
    for launch_id, src, dst, at in rows:
        out.setdefault(launch_id, []).append(
            StateChange(InstanceState(src) if src is not None else None, InstanceState(dst), at)
        )
    return out


_ORDER = {s: i for i, s in enumerate(InstanceState)}


def from_columns(row: Instance) -> list[Move]:
    """A row's moves as well as its columns know them: each state at the latest time it was
    entered (`<state>_at`), in time order (the lifecycle's at equal times), up to its first end;
    its current state last (at the time of the move before it, when its own is not written; an
    end at the row's last write). A state entered more than once shows its latest visit only:
    a stop followed by a later resume and stop is not seen, and its time reads as billing the
    full price (the most it can have cost). Nothing known: no moves (it bills nothing)."""
    entries = sorted(
        (at, _ORDER[s], s)
        for s in InstanceState
        if (at := getattr(row, f"{s.value}_at", None)) is not None
    )
    moves: list[Move] = []
    for at, _, state in entries:
        moves.append((state, at))
        if state in FINAL_STATES:
            break
    current = InstanceState(row.state)
    if moves and moves[-1][0] == current:
        return moves
    if current in FINAL_STATES:
        end = row.updated_at or (moves[-1][1] if moves else None)
        return [*moves, (current, end)] if end is not None else moves
    return [*moves, (current, moves[-1][1])] if moves else moves


def moves_of(row: Instance, recorded: Sequence[StateChange]) -> list[Move]:
    """A row's moves: its history where it holds the row's first state (`src` None); else what
    its columns know of the time before its first recorded move, then the recorded moves."""
    if recorded and recorded[0].src is None:
        return [(t.dst, t.at) for t in recorded]
    known = from_columns(row)
    if not recorded:
        return known
    first = recorded[0].at
    return [m for m in known if m[1] < first] + [(t.dst, t.at) for t in recorded]


def intervals(
    row: Instance, histories: Mapping[str, Sequence[StateChange]]
) -> list[billing.Interval[datetime]]:
    """The intervals (state, from, to) of the machine of `row`, from its history in `histories`
    (`history`), or its columns."""
    return billing.intervals(moves_of(row, histories.get(row.launch_id, ())))


__all__ = ["Move", "StateChange", "from_columns", "history", "intervals", "moves_of", "record"]

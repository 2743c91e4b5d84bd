"""Writes of instance rows: every state move, and every column written only where the row still
is as its writer read it. All of them are one statement through `update_rows`: a conditional
UPDATE that touches no object loaded in the session, so of two processes making the same write
exactly one succeeds, and a redelivered task finds nothing left to do.

The store writes what it is told: which move to make, and why, is control's to decide.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, overload

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from autoscaler.lifecycle import InstanceState, can_move
from autoscaler.store import transitions
from autoscaler.store.db import keyed_values
from autoscaler.store.instances import STATE_SINCE
from autoscaler.store.models import Instance


@overload
def update_rows(session: Session, where: Sequence[Any], values: Mapping[str, Any]) -> int: ...


@overload
def update_rows(
    session: Session, where: Sequence[Any], values: Mapping[str, Any], returning: Any
) -> list[Any]: ...


def update_rows(
    session: Session, where: Sequence[Any], values: Mapping[str, Any], returning: Any = None
) -> int | list[Any]:
    """UPDATE instances SET `values` WHERE every condition of `where` holds: one statement,
    leaving the session's loaded objects alone. The number of rows it wrote, or with
    `returning` (a column) that column's value in each row it wrote."""
    stmt = update(Instance).where(*where).values(**values)
    if returning is not None:
        stmt = stmt.returning(returning)
    result = session.execute(stmt.execution_options(synchronize_session=False))
    if returning is not None:
        return list(result.scalars())
    return int(getattr(result, "rowcount", 0) or 0)


def move(
    session: Session,
    launch_id: str,
    src: InstanceState | Sequence[InstanceState],
    dst: InstanceState,
    now: datetime,
    reason: str,
    *,
    only_if: Any = None,
    **fields: Any,
) -> bool:
    """Move a row from `src` (one state or several) to `dst` if it is still there; True if moved.

    The write is conditional on the current state (and on `only_if`, a further SQL condition
    on the row), so of two processes making the same move exactly one succeeds. Only the
    lifecycle's allowed transitions are accepted.
    """
    sources = (src,) if isinstance(src, InstanceState) else tuple(src)
    for s in sources:
        if not can_move(s, dst):
            raise ValueError(f"{s} -> {dst} is not an allowed transition")
    values = {"state": dst, STATE_SINCE[dst]: now, "state_reason": reason[:2000], "updated_at": now}
    values.update(fields)
    where = [Instance.launch_id == launch_id, Instance.state.in_(sources)]
    if only_if is not None:
        where.append(only_if)
    moved = bool(update_rows(session, where, values))
    if moved:  # its history row, in the same transaction (`store.transitions`)
        transitions.record(session, [launch_id], sources, dst, now)
    return moved


def move_many(
    session: Session,
    reasons: Mapping[str, str],
    src: InstanceState,
    dst: InstanceState,
    now: datetime,
    **fields: Any,
) -> list[str]:
    """`move` for many rows in one statement: each launch id with its own reason. Returns the
    launch ids that were still in `src` and moved."""
    if not reasons:
        return []
    if not can_move(src, dst):
        raise ValueError(f"{src} -> {dst} is not an allowed transition")
    reason, joined = keyed_values(
        session, {k: v[:2000] for k, v in reasons.items()}, Instance.launch_id
    )
    values = {
        "state": dst,
        STATE_SINCE[dst]: now,
        "state_reason": reason,
        "updated_at": now,
        **fields,
    }
    where = [Instance.state == src]
    where.append(Instance.launch_id.in_(list(reasons)) if joined is None else joined)
    moved = update_rows(session, where, values, returning=Instance.launch_id)
    transitions.record(session, moved, src, dst, now)  # their history rows, same transaction
    return moved


KEPT_WARM = Instance.keep_warm.is_(True)
"""`move(..., only_if=KEPT_WARM)`: only a machine with a place in its queue's warm pool."""

CANCEL_REQUESTED = Instance.cancel_requested_at.is_not(None)
"""`move(..., only_if=CANCEL_REQUESTED)`: only a machine an operator drained while its create
was in flight (`request_cancel`)."""


def unheard_since(heard_at: datetime | None) -> Any:
    """The `only_if` of a move made for silence: no sign of life (heartbeat or broker reply,
    both written to `last_heartbeat_at`) written after `heard_at`, the last one its judge read."""
    if heard_at is None:
        return Instance.last_heartbeat_at.is_(None)
    return or_(Instance.last_heartbeat_at.is_(None), Instance.last_heartbeat_at <= heard_at)


def start_resumes(session: Session, reasons: Mapping[str, str], now: datetime) -> list[str]:
    """stopped -> resuming for each launch id (with its reason), counted; its last signs of life
    forgotten, so only a word from the resumed worker makes it ready. The moved ids."""
    return move_many(
        session,
        reasons,
        InstanceState.STOPPED,
        InstanceState.RESUMING,
        now,
        resumes=Instance.resumes + 1,
        keep_warm=False,
        last_heartbeat_at=None,
        last_task_at=None,  # idle since it is ready again, not since before its stop
        running_tasks=0,
        silence_noted_at=None,
    )


def set_drain_requested(session: Session, launch_ids: Sequence[str], value: bool) -> None:
    if launch_ids:
        where = [Instance.launch_id.in_(launch_ids), Instance.state == InstanceState.READY]
        update_rows(session, where, {"drain_requested": value})


def set_keep_warm(session: Session, launch_ids: Sequence[str], value: bool) -> None:
    """Give machines (or take back) a place in their queue's warm pool, as `decide()` said."""
    if launch_ids:
        update_rows(session, [Instance.launch_id.in_(launch_ids)], {"keep_warm": value})


def set_broker_user(session: Session, launch_id: str, user: str | None) -> None:
    """The per-machine broker user made for this launch (None: deleted), for terminate."""
    update_rows(session, [Instance.launch_id == launch_id], {"broker_user": user})


def request_cancel(session: Session, launch_id: str, now: datetime) -> bool:
    """Mark a `creating` row (its create in flight) to be destroyed as soon as it exists; True
    if the row was still creating (else the caller reads it again and acts on its new state)."""
    where = [Instance.launch_id == launch_id, Instance.state == InstanceState.CREATING]
    return bool(update_rows(session, where, {"cancel_requested_at": now, "updated_at": now}))


def note_silence(session: Session, launch_ids: Collection[str], now: datetime) -> None:
    """A reconcile round found these machines silent past their limit (the first of two)."""
    if launch_ids:
        update_rows(session, [Instance.launch_id.in_(list(launch_ids))], {"silence_noted_at": now})


def retry_mark(step: str) -> str:
    return f"retrying {step}: "


def unnoted_retries(session: Session, retries: Collection[tuple[str, str]]) -> set[str]:
    """Of these (launch id, step) retries, the launches whose row does not say yet that the step
    is being retried (one query): a drain waiting on a busy machine is retried every round, and
    writing each of them every round was 1,876 UPDATEs a round at 20,000 machines
    (`benchmarks/reconcile.py`)."""
    steps = dict(retries)
    if not steps:
        return set()
    rows = session.execute(
        select(Instance.launch_id, Instance.state_reason).where(Instance.launch_id.in_(list(steps)))
    )
    return {
        launch_id
        for launch_id, reason in rows
        if not (reason or "").startswith(retry_mark(steps[launch_id]))
    }


def note_retry(session: Session, launch_id: str, step: str, reason: str) -> bool:
    """Mark a row's step as being retried; True the first time since its state last changed
    (so the retry is audited once, not on every reconcile)."""
    mark = retry_mark(step)
    where = [
        Instance.launch_id == launch_id,
        or_(Instance.state_reason.is_(None), ~Instance.state_reason.startswith(mark)),
    ]
    return bool(update_rows(session, where, {"state_reason": (mark + reason)[:2000]}))


__all__ = [
    "CANCEL_REQUESTED",
    "KEPT_WARM",
    "move",
    "move_many",
    "note_retry",
    "note_silence",
    "request_cancel",
    "retry_mark",
    "set_broker_user",
    "set_drain_requested",
    "set_keep_warm",
    "start_resumes",
    "unheard_since",
    "unnoted_retries",
    "update_rows",
]

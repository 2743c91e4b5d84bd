"""Launch intents: the rows an evaluation writes before any create, each tied to its decision's
event, claimed by the one launch task that gets there first, and naming each provider a launch
across providers sends its create to."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from autoscaler.lifecycle import InstanceState
from autoscaler.store import transitions
from autoscaler.store.models import Instance, ScaleEvent
from autoscaler.store.moves import move, update_rows


class Intent(NamedTuple):
    """One launch intent of an evaluation."""

    launch_id: str
    queue: str
    provider: str
    reason: str
    spec_key: str | None = None
    """What decide() rents it as (`policy.warm.spec_key`): a warm pool resumes only its like."""
    fallbacks: tuple[str, ...] = ()
    """The other providers decide() let it rent from (`Launch.fallbacks`)."""
    interruptible: bool = False
    """decide() let it rent at the queue's bid (`Launch.interruptible`)."""


def add_intents(
    session: Session,
    intents: Sequence[Intent | tuple[str, str, str, str]],
    now: datetime,
    config_version: int | None = None,
) -> None:
    """Launch intents of one evaluation of `config_version`: rows written before any create
    (`link_decisions` then ties each to its launch event)."""
    if not intents:
        return
    session.execute(
        insert(Instance),
        [
            {
                "launch_id": launch_id,
                "queue": queue,
                "provider": provider,
                "state": InstanceState.PENDING,
                "state_reason": reason[:2000],
                "pending_at": now,
                "created_at": now,
                "updated_at": now,
                "attempts": 0,
                "drain_requested": False,
                "running_tasks": 0,
                "config_version": config_version,
                "spec_key": key,
                "keep_warm": False,
                "resumes": 0,
                "placement": {"providers": [provider, *fallbacks]} if fallbacks else None,
                "interruptible": interruptible,
            }
            for launch_id, queue, provider, reason, key, fallbacks, interruptible in (
                Intent(*i) for i in intents
            )
        ],
    )
    transitions.record(session, [i[0] for i in intents], None, InstanceState.PENDING, now)


def link_decisions(session: Session, launch_ids: Sequence[str]) -> None:
    """Tie each new intent to the `launch` event its decision wrote (one statement)."""
    if not launch_ids:
        return
    event = (
        select(func.max(ScaleEvent.id))
        .where(
            ScaleEvent.launch_id == Instance.launch_id,
            ScaleEvent.kind == "scale_up",
            ScaleEvent.action == "launch",
        )
        .scalar_subquery()
    )
    update_rows(session, [Instance.launch_id.in_(list(launch_ids))], {"decision_id": event})


def claim_intent(session: Session, launch_id: str, now: datetime, token_hash: str) -> bool:
    """pending -> creating for the one launch task that gets there first (one more attempt, the
    machine's worker token hash recorded); True if this call claimed it."""
    return move(
        session,
        launch_id,
        InstanceState.PENDING,
        InstanceState.CREATING,
        now,
        "creating",
        attempts=Instance.attempts + 1,
        worker_token_hash=token_hash,
    )


def try_provider(session: Session, launch_id: str, provider: str) -> bool:
    """A launch across providers is about to send its create to `provider`: the row names it
    (reconcile looks an ambiguous create up there) and lists it among those tried, before the
    create leaves. Conditional on the row still creating (an operator's cancel wins)."""
    row = session.scalars(
        select(Instance).where(Instance.launch_id == launch_id).with_for_update()
    ).one_or_none()
    if row is None or row.state != InstanceState.CREATING:
        return False
    placement = dict(row.placement or {})
    tried = [p for p in placement.get("tried", []) if p != provider]
    placement["tried"] = [*tried, provider]
    row.provider, row.placement = provider, placement
    session.flush()
    return True


__all__ = ["Intent", "add_intents", "claim_intent", "link_decisions", "try_provider"]

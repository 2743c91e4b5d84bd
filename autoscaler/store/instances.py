"""Queries on instance rows that the metrics side needs: which of our machines are live."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from autoscaler.lifecycle import InstanceState
from autoscaler.store.models import Instance

SERVING_STATES = (InstanceState.READY, InstanceState.DRAINING)
"""States in which an agent's worker may be taking (or finishing) jobs."""


def live_agent_workers(
    session: Session, now: datetime, heartbeat_window: float
) -> dict[str, tuple[str, ...]]:
    """Per queue, the worker names our agents reported within the heartbeat window.

    A machine silent for longer is not live, whatever its state says; one that has not told us
    its worker name yet is reported by launch id (it cannot be matched to a broker worker).
    """
    since = now - timedelta(seconds=heartbeat_window)
    rows = session.execute(
        select(Instance.queue, Instance.worker_name, Instance.launch_id)
        .where(Instance.state.in_(SERVING_STATES), Instance.last_heartbeat_at >= since)
        .order_by(Instance.queue, Instance.launch_id)
    ).all()
    out: dict[str, list[str]] = {}
    for queue, worker, launch_id in rows:
        out.setdefault(queue, []).append(worker or launch_id)
    return {queue: tuple(names) for queue, names in out.items()}

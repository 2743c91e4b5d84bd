"""Warm pools as the operator views read them: each queue's pool in the newest config, what a
queue's pool holds and bills, and its warm hits and misses (the `warm_pool` events), counted
over the UTC day by `status`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from autoscaler.config.durations import parse_duration
from autoscaler.store import config_versions
from autoscaler.store.events import WARM_EVENT
from autoscaler.store.models import ScaleEvent


@dataclass(frozen=True)
class PoolConfig:
    """A queue's `autoscale.warm_pool` as the newest config says (size 0: no pool)."""

    size: int
    keep_for: float
    """Seconds a stopped machine is kept before it is destroyed."""


@dataclass
class WarmPoolView:
    """A queue's warm pool: its size in the newest config, its machines by warm state, what the
    stopped ones bill, and today's warm hits (resumed machines that became ready) and misses
    (resumes that failed: destroyed, a fresh machine rented)."""

    size: int = 0
    keep_for: float | None = None
    stopped: int = 0
    stopping: int = 0
    resuming: int = 0
    storage_per_hour: float = 0.0
    hits_today: int = 0
    misses_today: int = 0

    @property
    def shown(self) -> bool:
        """Worth a column: a pool is configured, or it has machines or warm events today."""
        return bool(
            self.size
            or self.stopped
            or self.stopping
            or self.resuming
            or self.hits_today
            or self.misses_today
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "keep_for_seconds": self.keep_for,
            "stopped": self.stopped,
            "stopping": self.stopping,
            "resuming": self.resuming,
            "storage_per_hour": round(self.storage_per_hour, 6),
            "hits_today": self.hits_today,
            "misses_today": self.misses_today,
        }


def pool_configs(document: dict[str, Any] | None) -> dict[str, PoolConfig]:
    """Queue -> its warm pool, for the queues of a config document that have one (size > 0)."""
    out: dict[str, PoolConfig] = {}
    for name, cfg in ((document or {}).get("queues") or {}).items():
        auto = cfg.get("autoscale") if isinstance(cfg, dict) else None
        pool = auto.get("warm_pool") if isinstance(auto, dict) else None
        size = _int(pool.get("size")) if isinstance(pool, dict) else None
        if not size or size < 0 or not isinstance(pool, dict):
            continue
        try:
            keep_for = parse_duration(pool.get("keep_for", 86400.0))
        except ValueError:
            continue
        if math.isfinite(keep_for) and keep_for > 0:
            out[str(name)] = PoolConfig(size, keep_for)
    return out


def warm_pools(session: Session) -> dict[str, PoolConfig]:
    """Queue -> its warm pool in the newest config (queues without one left out). One query."""
    latest = config_versions.latest(session)
    return pool_configs(latest.document if latest else None)


def warm_counts(session: Session, since: datetime | None = None) -> dict[tuple[str, str], int]:
    """(queue, action) -> warm pool events (`events.WARM_EVENT`: stop, stopped, resume, hit,
    miss, destroy) since `since` (or ever), queue "" for none. One grouped query."""
    q = select(ScaleEvent.queue, ScaleEvent.action, func.count()).where(
        ScaleEvent.kind == WARM_EVENT
    )
    if since is not None:
        q = q.where(ScaleEvent.at >= since)
    rows = session.execute(q.group_by(ScaleEvent.queue, ScaleEvent.action))
    return {(queue or "", action): n for queue, action, n in rows}


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


__all__ = ["PoolConfig", "WarmPoolView", "pool_configs", "warm_counts", "warm_pools"]

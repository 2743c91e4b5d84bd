"""Small builders for policy tests: configs from dicts, snapshots from a few numbers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from autoscaler.config import load_config_text
from autoscaler.config.models import Config
from autoscaler.config.provider_options import MockOptions
from autoscaler.lifecycle import InstanceState
from autoscaler.policy.snapshot import (
    BackoffState,
    Machine,
    QueueMetrics,
    QueueSnapshot,
    Snapshot,
)

NOW = datetime(2025, 6, 2, 12, 0, tzinfo=UTC)
PROVIDERS = {"gpu": MockOptions(kind="mock"), "gpu2": MockOptions(kind="mock")}


def config(
    scale_up: list[dict[str, Any]] | None = None,
    scale_down: list[dict[str, Any]] | None = None,
    *,
    min_workers: int = 0,
    max_workers: int = 4,
    price: float = 0.60,
    priority: int = 0,
    queues: dict[str, dict[str, Any]] | None = None,
    limits: dict[str, Any] | None = None,
    backoff: dict[str, Any] | None = None,
) -> Config:
    """One queue 'q' (or several via `queues`: name -> autoscale overrides)."""
    import yaml

    def block(over: dict[str, Any]) -> dict[str, Any]:
        base: dict[str, Any] = {
            "provider": "gpu",
            "min_workers": min_workers,
            "max_workers": max_workers,
            "priority": priority,
            "scale_up": scale_up or [],
            "scale_down": scale_down or [],
            "instance": {"gpu": "RTX 4090", "max_price_per_hour": price},
        }
        base.update(over)
        return {"autoscale": base}

    doc: dict[str, Any] = {
        "queues": {name: block(over) for name, over in (queues or {"q": {}}).items()}
    }
    if limits:
        doc["limits"] = limits
    if backoff:
        doc["backoff"] = backoff
    return load_config_text(yaml.safe_dump(doc), registered_providers=PROVIDERS)


def metrics(
    pending: int = 0,
    oldest: float | None = None,
    in_flight: int = 0,
    *,
    queue: str = "q",
    stale: bool = False,
    external: tuple[tuple[str, float], ...] = (),
) -> QueueMetrics:
    if oldest is None and pending > 0:
        oldest = 1.0
    return QueueMetrics(queue, pending, oldest, in_flight, NOW, external=external, stale=stale)


def ready(
    lid: str,
    *,
    idle_for: float = 0.0,
    running: int = 0,
    created_ago: float = 3600.0,
    drain_requested: bool = False,
    price: float | None = 0.60,
    now: datetime = NOW,
) -> Machine:
    return Machine(
        launch_id=lid,
        state=InstanceState.READY,
        created_at=now - timedelta(seconds=created_ago),
        provider="gpu",
        ready_at=now - timedelta(seconds=created_ago - 60),
        running_tasks=running,
        last_task_at=now - timedelta(seconds=idle_for),
        drain_requested=drain_requested,
        price_per_hour=price,
    )


def booting(
    lid: str,
    *,
    ago: float = 30.0,
    state: InstanceState = InstanceState.BOOTING,
    now: datetime = NOW,
) -> Machine:
    return Machine(
        launch_id=lid,
        state=state,
        created_at=now - timedelta(seconds=ago),
        provider="gpu",
        price_per_hour=0.60,
    )


def snap(
    m: QueueMetrics | None = None,
    machines: tuple[Machine, ...] = (),
    *,
    manual: int = 0,
    backoffs: tuple[BackoffState, ...] = (),
    name: str = "q",
) -> Snapshot:
    return Snapshot((QueueSnapshot(name, m, machines, manual, backoffs),))

"""Each queue's numbers as the dashboard shows them, and the chart's samples taken from them.

Samples are written by the API whenever it shows the numbers (the overview, the chart's
history, a /metrics scrape), from the rows `autoscaler status` reads (store/queue_views.py): the
loop never writes them, and a reading sampled twice is one row.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from autoscaler.control.runtime import Runtime, log, utc_now
from autoscaler.store import queue_samples, queue_views
from autoscaler.store.db import Session


def queue_rows(session: Session, rt: Runtime, at: datetime) -> list[dict[str, Any]]:
    """`autoscaler status`'s own queue views (store/queue_views.py: the same rows, the same
    arithmetic), each with its autoscale settings from the newest config."""
    loaded = rt.load(session)
    configured = loaded.config.queues if loaded else {}
    out = []
    for view in queue_views.queues(session, at):
        row = view.as_json()
        cfg = configured.get(view.queue)
        auto = cfg.autoscale if cfg is not None else None
        row["configured"] = cfg is not None
        row["autoscale"] = (
            None
            if auto is None
            else {
                "enabled": auto.enabled,
                "provider": ", ".join(auto.providers),
                "providers": list(auto.providers),
                "placement": auto.placement,
                "min_workers": auto.min_workers,
                "max_workers": auto.max_workers,
                "priority": auto.priority,
                "gpu": " or ".join(auto.instance.gpus),
                "gpus": list(auto.instance.gpus),
                "max_price_per_hour": auto.instance.max_price_per_hour,
            }
        )
        out.append(row)
    return out


def record_samples(session: Session, rows: list[dict[str, Any]], now: datetime) -> None:
    """One chart sample per queue row that has a reading."""
    samples = [
        {
            "queue": r["queue"],
            "at": datetime.fromisoformat(r["reading_at"]),
            "pending": r["pending"] or 0,
            "running": r["running"],
            "workers": r["workers"]["live"],
            "booting": r["workers"]["booting"],
            "desired": r["desired"],
        }
        for r in rows
        if r["reading_at"] is not None
    ]
    queue_samples.record(session, samples, now)


def take_samples(session: Session, rt: Runtime) -> None:
    """Record the chart's samples on the side of another answer (/metrics, the history):
    a sample that cannot be written costs that answer nothing."""
    try:
        with session.begin_nested():
            now = utc_now()
            record_samples(session, queue_rows(session, rt, now), now)
    except Exception as exc:  # the chart misses a point; the scrape still answers
        log.warning("dashboard: no chart sample this time (%s)", type(exc).__name__)


__all__ = ["queue_rows", "record_samples", "take_samples"]

"""What a loop test watches and applies: the watched app's queue, the local provider's machine
command and the mock provider's configs.

Apart from `loopkit.Loop` because they describe the world the control plane scales, not the
control plane itself.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import redis

from tests.control import e2eapp
from tests.control.loopprocs import WATCH_BROKER, unique

if TYPE_CHECKING:
    from tests.control.loopkit import Loop


class Watched:
    """A unique queue on the watched Redis, jobs published with the e2e app's Celery app."""

    def __init__(self, loop: Loop, prefix: str = "e2e") -> None:
        self.queue = unique(prefix)
        self.record_key = f"e2e:{self.queue}:runs"
        self.loop = loop
        loop.watch_keys.update(
            {
                self.queue,
                self.record_key,
                f"_kombu.binding.{self.queue}",
                f"_kombu.binding_permanent.{self.queue}",
            }
            | {f"{self.queue}\x06\x16{p}" for p in (3, 6, 9)}
        )
        self.app = e2eapp.publisher(WATCH_BROKER)

    @property
    def metrics(self) -> dict[str, Any]:
        return {"source": "celery", "url": WATCH_BROKER}

    def publish(self, n: int, seconds: float = 1.0, prefix: str = "job") -> list[str]:
        ids = [f"{prefix}-{i}" for i in range(n)]
        with self.app.connection_for_write() as conn:
            for job_id in ids:
                self.app.send_task(
                    "e2eapp.job",
                    args=[self.record_key, job_id, seconds],
                    queue=self.queue,
                    routing_key=self.queue,
                    connection=conn,
                )
        return ids

    def pending(self) -> int:
        r = redis.Redis.from_url(WATCH_BROKER)
        try:
            return int(r.llen(self.queue))
        finally:
            r.close()

    def empty(self) -> int:
        """Delete the waiting jobs (the test stands in for workers that took them)."""
        r = redis.Redis.from_url(WATCH_BROKER)
        try:
            return int(r.delete(self.queue))
        finally:
            r.close()

    def runs(self) -> list[dict[str, Any]]:
        return e2eapp.runs(WATCH_BROKER, self.record_key)

    def close(self) -> None:
        self.app.close()


def local_command(queue: str) -> str:
    """The local provider's machine: a real Celery worker of the e2e app on `queue`."""
    return (
        f"E2E_BROKER_URL={WATCH_BROKER} exec {sys.executable} -m celery -A e2eapp worker "
        f'-Q {queue} -n "$AUTOSCALER_LABEL@%h" --pool prefork -c 1 '
        "--prefetch-multiplier 1 -l warning"
    )


# --------------------------------------------------------------------------- provider views
# --------------------------------------------------------------------------- configs

POLL = 2


def mock_queue(
    watched: Watched,
    *,
    max_workers: int = 2,
    scale_up: list[dict[str, Any]] | None = None,
    scale_down: list[dict[str, Any]] | None = None,
    provider: str = "sandbox",
) -> dict[str, Any]:
    return {
        "metrics": watched.metrics,
        "autoscale": {
            "provider": provider,
            "max_workers": max_workers,
            "scale_up": scale_up if scale_up is not None else [{"trigger": "no_workers"}],
            "scale_down": scale_down
            if scale_down is not None
            else [{"trigger": "idle", "timeout": "3s"}],
            "instance": {"gpu": "RTX 4090", "max_price_per_hour": 1.0},
        },
    }


def mock_config(queues: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {
        "poll_interval": POLL,
        "boot_timeout": 30,
        "heartbeat_timeout": 60,
        "backoff": {"base": 2, "cap": 10},
        "providers": {"sandbox": {"kind": "mock", "boot_delay": 1, "price_per_hour": 0.1}},
        "queues": queues,
        **top,
    }

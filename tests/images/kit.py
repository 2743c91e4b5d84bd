"""What the image tests share: the images' names, waiting with the logs at hand, a container's
health check and the uids of its processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import requests

from tests.containers.engine import podman

UID = "10001"
"""The images' user (worker and control plane alike)."""


@dataclass(frozen=True)
class Images:
    worker: str
    control: str


IMAGES = Images(
    worker="localhost/gpu-queue-autoscaler-worker:dev", control="localhost/gpu-queue-autoscaler:dev"
)


def wait(what: str, check: Callable[[], Any], timeout: float, dump: Callable[[], str]) -> Any:
    """`check()`'s first truthy answer within `timeout` seconds; else fail with `dump()`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}\n{dump()}")


def healthy(container: str) -> bool:
    """The container's own health check, run now (no systemd timer runs it here)."""
    return podman("healthcheck", "run", container, check=False, timeout=60).returncode == 0


def uids(container: str) -> set[str]:
    """The host uid of every process in the container (no user namespace: the same uids)."""
    return set(podman("top", container, "huser").stdout.split()[1:])  # after the header


def status_code(url: str, **kw: Any) -> int | None:
    try:
        return requests.get(url, timeout=2, **kw).status_code
    except requests.RequestException:
        return None

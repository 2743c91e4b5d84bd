"""The machine lifecycle, shared by the pure policy and the store (no I/O here)."""

from __future__ import annotations

import enum


class InstanceState(enum.StrEnum):
    """The machine lifecycle (DESIGN.md): a row is written before any provider call."""

    PENDING = "pending"
    CREATING = "creating"
    BOOTING = "booting"
    READY = "ready"
    DRAINING = "draining"
    DRAINED = "drained"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    FAILED = "failed"
    LOST = "lost"


LIVE_STATES = (
    InstanceState.PENDING,
    InstanceState.CREATING,
    InstanceState.BOOTING,
    InstanceState.READY,
    InstanceState.DRAINING,
    InstanceState.DRAINED,
    InstanceState.TERMINATING,
)
"""States in which a machine may exist at the provider and may be billing."""

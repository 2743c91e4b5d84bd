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


class MachineStatus(enum.StrEnum):
    """A machine's state at the provider, normalised across providers."""

    STARTING = "starting"  # being allocated, pulling the image, booting
    RUNNING = "running"  # up (the worker on it may still be starting)
    DEAD = "dead"  # exited, errored, offline: will not become running by itself
    GONE = "gone"  # terminated / destroyed at the provider


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

S = InstanceState
ALLOWED_TRANSITIONS: dict[InstanceState, frozenset[InstanceState]] = {
    S.PENDING: frozenset({S.CREATING, S.FAILED}),
    S.CREATING: frozenset({S.BOOTING, S.FAILED}),
    S.BOOTING: frozenset({S.READY, S.TERMINATING, S.LOST}),
    S.READY: frozenset({S.DRAINING, S.TERMINATING, S.LOST}),
    S.DRAINING: frozenset({S.DRAINED, S.TERMINATING, S.LOST}),
    S.DRAINED: frozenset({S.TERMINATING, S.LOST}),
    S.TERMINATING: frozenset({S.TERMINATED, S.LOST}),
    S.TERMINATED: frozenset(),
    S.FAILED: frozenset(),
    S.LOST: frozenset(),
}
"""Every move a machine's row may make (Ray's instance manager keeps the same kind of table).

A row only moves along these edges, by a conditional write on its current state, so two
processes acting on one machine cannot both succeed and no state is skipped by accident:
a machine is destroyed only from TERMINATING, and reaches TERMINATING from READY only when dead
or silent (never for scale-down, which goes through DRAINING and DRAINED).
"""

FINAL_STATES = frozenset(s for s, nxt in ALLOWED_TRANSITIONS.items() if not nxt)


def can_move(src: InstanceState, dst: InstanceState) -> bool:
    return dst in ALLOWED_TRANSITIONS[src]

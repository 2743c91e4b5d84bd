"""The machine lifecycle, shared by the pure policy and the store (no I/O here)."""

from __future__ import annotations

import enum


class InstanceState(enum.StrEnum):
    """The machine lifecycle (ARCHITECTURE.md): a row is written before any provider call."""

    PENDING = "pending"
    CREATING = "creating"
    BOOTING = "booting"
    READY = "ready"
    DRAINING = "draining"
    DRAINED = "drained"
    STOPPING = "stopping"
    STOPPED = "stopped"
    RESUMING = "resuming"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    FAILED = "failed"
    LOST = "lost"


class MachineStatus(enum.StrEnum):
    """A machine's state at the provider, normalised across providers."""

    STARTING = "starting"  # being allocated, pulling the image, booting
    RUNNING = "running"  # up (the worker on it may still be starting)
    STOPPED = "stopped"  # stopped with its disk kept (RunPod EXITED, Vast stopped): `start` resumes
    DEAD = "dead"  # errored, offline: will not become running by itself
    GONE = "gone"  # terminated / destroyed at the provider


LIVE_STATES = (
    InstanceState.PENDING,
    InstanceState.CREATING,
    InstanceState.BOOTING,
    InstanceState.READY,
    InstanceState.DRAINING,
    InstanceState.DRAINED,
    InstanceState.STOPPING,
    InstanceState.STOPPED,
    InstanceState.RESUMING,
    InstanceState.TERMINATING,
)
"""States in which a machine may exist at the provider and may be billing."""

BOOTING_STATES = (
    InstanceState.PENDING,
    InstanceState.CREATING,
    InstanceState.BOOTING,
    InstanceState.RESUMING,
)
"""A machine on its way to serving (a launch, or a warm pool's machine resuming): counted as
capacity (no stacking), never drained."""

LEAVING_STATES = (InstanceState.DRAINING, InstanceState.DRAINED, InstanceState.TERMINATING)
"""Going away: no longer capacity, still billing (counted by spend caps)."""

WARM_STATES = (InstanceState.STOPPING, InstanceState.STOPPED)
"""A warm pool's machines: drained, stopped (or being stopped) with their disk kept. Not
capacity, not counted by `max_workers`; billed at their storage price once stopped."""

S = InstanceState
ALLOWED_TRANSITIONS: dict[InstanceState, frozenset[InstanceState]] = {
    S.PENDING: frozenset({S.CREATING, S.FAILED}),
    S.CREATING: frozenset({S.BOOTING, S.FAILED}),
    S.BOOTING: frozenset({S.READY, S.TERMINATING, S.LOST}),
    S.READY: frozenset({S.DRAINING, S.TERMINATING, S.LOST}),
    S.DRAINING: frozenset({S.DRAINED, S.TERMINATING, S.LOST}),
    S.DRAINED: frozenset({S.STOPPING, S.TERMINATING, S.LOST}),
    S.STOPPING: frozenset({S.STOPPED, S.TERMINATING, S.LOST}),
    S.STOPPED: frozenset({S.RESUMING, S.TERMINATING, S.LOST}),
    S.RESUMING: frozenset({S.READY, S.TERMINATING, S.LOST}),
    S.TERMINATING: frozenset({S.TERMINATED, S.LOST}),
    S.TERMINATED: frozenset(),
    S.FAILED: frozenset(),
    S.LOST: frozenset(),
}
"""Every move a machine's row may make (Ray's instance manager keeps the same kind of table).

A row only moves along these edges, by a conditional write on its current state, so two
processes acting on one machine cannot both succeed and no state is skipped by accident:
a machine is destroyed only from TERMINATING, and reaches TERMINATING from READY only when dead
or silent (never for scale-down, which goes through DRAINING and DRAINED). A warm pool's machine
is stopped only once DRAINED (never with work on it), and comes back through RESUMING to READY
at its worker's first proof of life, as a booting one does.
"""

FINAL_STATES = frozenset(s for s, nxt in ALLOWED_TRANSITIONS.items() if not nxt)


def can_move(src: InstanceState, dst: InstanceState) -> bool:
    return dst in ALLOWED_TRANSITIONS[src]

"""The machine lifecycle, shared by the pure policy and the store (no I/O here)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


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


@dataclass(frozen=True)
class Traits:
    """What a state means to the rest of the code. One row per state in `STATES`, so a new
    state is described in one place; the tuples below and the checks that read them (the
    worker token, the heartbeat's answer, remote control) follow from it."""

    next: frozenset[InstanceState]
    """The moves a row in this state may make (see `ALLOWED_TRANSITIONS`)."""
    live: bool = False
    """The machine may exist at the provider and may be billing."""
    booting: bool = False
    """On its way to serving (a launch, or a warm pool's machine resuming): counted as
    capacity (no stacking), never drained."""
    leaving: bool = False
    """Going away: no longer capacity, still billing (counted by spend caps)."""
    warm: bool = False
    """A warm pool's machine: drained, stopped (or being stopped) with its disk kept. Not
    capacity, not counted by `max_workers`; billed at its storage price once stopped."""
    token_opens: bool = False
    """Its worker token opens the worker endpoints: from the create to the drained report,
    and again from a warm pool's resume. A machine stopping or stopped holds no live
    credential; terminating, terminated, failed or lost: refused."""
    may_serve: bool = False
    """A heartbeat's answer lets its worker run (a create's answer may still be on its way back
    when a fast machine first calls); in any other state the worker is told to drain and
    start nothing."""
    heard: bool = False
    """Its worker may answer remote control, and broker replies may move its row."""


S = InstanceState
_ = frozenset
STATES: dict[InstanceState, Traits] = {
    S.PENDING: Traits(_({S.CREATING, S.FAILED}), live=True, booting=True),
    S.CREATING: Traits(
        _({S.BOOTING, S.FAILED}), live=True, booting=True, token_opens=True, may_serve=True
    ),
    S.BOOTING: Traits(
        _({S.READY, S.TERMINATING, S.LOST}),
        live=True,
        booting=True,
        token_opens=True,
        may_serve=True,
        heard=True,
    ),
    S.READY: Traits(
        _({S.DRAINING, S.TERMINATING, S.LOST}),
        live=True,
        token_opens=True,
        may_serve=True,
        heard=True,
    ),
    S.DRAINING: Traits(
        _({S.DRAINED, S.TERMINATING, S.LOST}),
        live=True,
        leaving=True,
        token_opens=True,
        heard=True,
    ),
    S.DRAINED: Traits(
        _({S.STOPPING, S.TERMINATING, S.LOST}), live=True, leaving=True, token_opens=True
    ),
    S.STOPPING: Traits(_({S.STOPPED, S.TERMINATING, S.LOST}), live=True, warm=True),
    S.STOPPED: Traits(_({S.RESUMING, S.TERMINATING, S.LOST}), live=True, warm=True),
    S.RESUMING: Traits(
        _({S.READY, S.TERMINATING, S.LOST}),
        live=True,
        booting=True,
        token_opens=True,
        may_serve=True,
        heard=True,
    ),
    S.TERMINATING: Traits(_({S.TERMINATED, S.LOST}), live=True, leaving=True),
    S.TERMINATED: Traits(_()),
    S.FAILED: Traits(_()),
    S.LOST: Traits(_()),
}
"""Every state and what it means; `tests/test_lifecycle.py` fails on a state without its row,
on a named set that disagrees with it, and on a state that can never reach an end."""


def _having(trait: str) -> tuple[InstanceState, ...]:
    return tuple(state for state, traits in STATES.items() if getattr(traits, trait))


LIVE_STATES = _having("live")
BOOTING_STATES = _having("booting")
LEAVING_STATES = _having("leaving")
WARM_STATES = _having("warm")
TOKEN_STATES = _having("token_opens")
MAY_SERVE = _having("may_serve")
HEARD_STATES = _having("heard")

ALLOWED_TRANSITIONS: dict[InstanceState, frozenset[InstanceState]] = {
    state: traits.next for state, traits in STATES.items()
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

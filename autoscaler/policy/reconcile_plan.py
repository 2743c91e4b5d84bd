"""What `reconcile()` returns: a typed plan, one frozen dataclass per action kind.

The rules (`policy.reconcile_rules`) judge each row and say so as a `Transition`, a `Retry` or
a `NoteSilence`; `typed()` turns those judgements into the actions below, once, here, so no
port interprets a flag: the applier (`control.reconcile_executor.apply_reconcile`) hands each
action to a `ReconcileActions` port, production's (`control.reconcile_actions`) or the
simulator's (`sim.reconcile_port`).

Moves are conditional: a `Move`, `DestroySilent` or `WarmMiss` holds only if its row is still
in `src` (and, for silence, no sign of life was written after `heard_at`); its `then`, the
consequences, follow only once it held, in their order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from autoscaler.lifecycle import InstanceState, can_move

S = InstanceState

StepName = Literal["launch", "drain", "terminate", "stop", "resume"]

OrphanKey = tuple[str, str]
"""(provider, provider instance id)"""


# ---------------------------------------------------------------- the rules' judgements
@dataclass(frozen=True)
class Transition:
    """Move `launch_id` from `src` to `dst`. `rental` feeds the backoff of (queue, provider):
    "failed" adds a failure (and `avoid_host` marks the host), "ok" clears it. The rules'
    judgement; `typed()` makes it the actions the ports carry out."""

    launch_id: str
    queue: str
    provider: str
    src: InstanceState
    dst: InstanceState
    reason: str
    provider_instance_id: str | None = None
    host_id: str | None = None
    rental: Literal["failed", "ok"] | None = None
    avoid_host: bool = False
    warm: Literal["hit", "miss"] | None = None
    """A resume from the warm pool that came up (hit) or failed (miss: a fresh machine is rented
    at once, and the queue does not back off)."""
    handback: bool = False
    """The provider says the machine no longer runs while its worker may have held jobs: they
    are handed back to the broker (`control.steps.handback`), and its queue evaluated at once."""
    preempted: bool = False
    """The provider stopped it because it was outbid (an interruptible machine): no failure of
    the rental nor of its host by itself; counted per queue and host."""
    silenced: bool = False
    """Made for silence: it holds only if no sign of life was written after `heard_at` (the
    last one the round read), so a heartbeat committed while the round ran keeps the machine."""
    heard_at: datetime | None = None

    def __post_init__(self) -> None:
        if not can_move(self.src, self.dst):
            raise ValueError(f"{self.src} -> {self.dst} is not an allowed transition")


@dataclass(frozen=True)
class Retry:
    """Enqueue the task of a lifecycle step again (its earlier task was lost or is waiting);
    audited once per stretch of retries."""

    launch_id: str
    queue: str
    step: StepName
    reason: str


@dataclass(frozen=True)
class NoteSilence:
    """A machine found silent past its limit for the first time: noted, destroyed only if a
    later round (`SILENCE_CONFIRM` on) still finds it silent."""

    launch_id: str
    queue: str
    reason: str


@dataclass(frozen=True)
class DestroyOrphan:
    """Destroy a machine carrying our label that no live row owns (past its grace)."""

    provider: str
    provider_instance_id: str
    label: str
    reason: str


# ---------------------------------------------------------------- moves
@dataclass(frozen=True)
class MarkReady:
    """booting or resuming -> ready at its worker's first sign of life: the one way a machine
    becomes ready (`control.machines.mark_ready`: the rental counts as good, a slow cold boot
    avoids its host)."""

    launch_id: str
    queue: str
    provider: str
    reason: str


@dataclass(frozen=True)
class Move:
    """`src` -> `dst` if the row is still in `src`; then its consequences, in order."""

    launch_id: str
    queue: str
    provider: str
    src: InstanceState
    dst: InstanceState
    reason: str
    provider_instance_id: str | None = None
    host_id: str | None = None
    then: tuple[Consequence, ...] = ()


@dataclass(frozen=True)
class DestroySilent:
    """`src` -> terminating for silence, if the row is still in `src` and no sign of life was
    written after `heard_at` (the last one the round read); then its consequences."""

    launch_id: str
    queue: str
    provider: str
    src: InstanceState
    reason: str
    heard_at: datetime | None
    then: tuple[Consequence, ...] = ()


@dataclass(frozen=True)
class WarmMiss:
    """resuming -> terminating for a resume that failed: no backoff, its queue evaluated at once
    (a fresh machine is rented now); then its consequences (its host avoided)."""

    launch_id: str
    queue: str
    provider: str
    host_id: str | None
    reason: str
    then: tuple[Consequence, ...] = ()


# ---------------------------------------------------------------- consequences of a move
@dataclass(frozen=True)
class HandBack:
    """The machine's jobs go back to its broker after the hand-back's grace."""

    launch_id: str
    queue: str


@dataclass(frozen=True)
class Preempted:
    """Outbid and stopped by its provider: its event, and its host avoided once it has
    preempted enough of our machines."""

    launch_id: str
    queue: str
    provider: str
    host_id: str | None
    reason: str


@dataclass(frozen=True)
class CancelIfRequested:
    """An adopted create that an operator cancelled meanwhile: destroyed."""

    launch_id: str


@dataclass(frozen=True)
class Audit:
    """The move's event (reconcile, "src->dst", its reason)."""

    launch_id: str
    queue: str
    src: InstanceState
    dst: InstanceState
    reason: str


@dataclass(frozen=True)
class WarmStopped:
    """Stopped for the warm pool: its warm event."""

    launch_id: str
    queue: str
    reason: str


@dataclass(frozen=True)
class WarmLost:
    """Lost while resuming: a warm miss's event, and its queue evaluated at once."""

    launch_id: str
    queue: str
    reason: str


@dataclass(frozen=True)
class BackOff:
    """A failed rental: the (queue, provider) backoff grows."""

    queue: str
    provider: str
    reason: str


@dataclass(frozen=True)
class EndBackoff:
    """A rental that served: the (queue, provider) backoff ends."""

    queue: str
    provider: str


@dataclass(frozen=True)
class AvoidHost:
    """The provider avoids this host for a while (after the round's transaction)."""

    provider: str
    host_id: str
    reason: str


Consequence = (
    HandBack
    | Preempted
    | CancelIfRequested
    | Audit
    | WarmStopped
    | WarmLost
    | BackOff
    | EndBackoff
    | AvoidHost
)


@dataclass(frozen=True)
class KeepOrphans:
    """Every orphan now seen, with its label and first sighting: what the store keeps."""

    sightings: Mapping[OrphanKey, tuple[str, datetime]]


# ---------------------------------------------------------------- after the transaction
@dataclass(frozen=True)
class SendStep:
    """Send the lifecycle step that carries a move out (terminate, stop), whether or not this
    round's move held: a step finds its row and does nothing if it has nothing to do."""

    launch_id: str
    step: Literal["terminate", "stop"]


@dataclass(frozen=True)
class Evaluate:
    """Evaluate the queue now (a lost machine's jobs come back: a fresh one may be needed)."""

    queue: str


RowMove = MarkReady | Move | DestroySilent | WarmMiss

ACTION_KINDS: tuple[type, ...] = (
    MarkReady,
    Move,
    DestroySilent,
    WarmMiss,
    HandBack,
    Preempted,
    CancelIfRequested,
    Audit,
    WarmStopped,
    WarmLost,
    BackOff,
    EndBackoff,
    AvoidHost,
    NoteSilence,
    Retry,
    KeepOrphans,
    SendStep,
    Evaluate,
    DestroyOrphan,
)
"""Every action kind a `ReconcilePlan` carries (the port has one method per kind)."""


@dataclass(frozen=True)
class ReconcilePlan:
    """The round's actions, in the order they are applied: the moves (each with its
    consequences), the silences noted, the retries, the orphan sightings kept; after the
    transaction, the steps sent and the queues evaluated; the orphans destroyed.
    `transitions` are the rules' judgements the moves were made from (for audits and tests)."""

    transitions: tuple[Transition, ...] = ()
    retries: tuple[Retry, ...] = ()
    destroys: tuple[DestroyOrphan, ...] = ()
    orphans: Mapping[OrphanKey, tuple[str, datetime]] | None = None
    """Every orphan now seen, with its label and first sighting (what the store keeps)."""
    silences: tuple[NoteSilence, ...] = ()
    """Machines found silent past their limit in this round (the first of two)."""
    moves: tuple[RowMove, ...] = field(default=())
    steps: tuple[SendStep, ...] = field(default=())
    evaluations: tuple[Evaluate, ...] = field(default=())


def typed(
    transitions: tuple[Transition, ...],
    retries: tuple[Retry, ...],
    destroys: tuple[DestroyOrphan, ...],
    orphans: Mapping[OrphanKey, tuple[str, datetime]],
    silences: tuple[NoteSilence, ...],
) -> ReconcilePlan:
    """The plan of these judgements: every flag of a `Transition` read here, once."""
    steps: list[SendStep] = []
    for t in transitions:
        if t.dst == S.TERMINATING:
            steps.append(SendStep(t.launch_id, "terminate"))
        elif t.dst == S.STOPPING:
            steps.append(SendStep(t.launch_id, "stop"))
    handed = sorted({t.queue for t in transitions if t.handback})
    return ReconcilePlan(
        transitions,
        retries,
        destroys,
        orphans,
        silences,
        moves=tuple(_move(t) for t in transitions),
        steps=tuple(steps),
        evaluations=tuple(Evaluate(q) for q in handed),
    )


def _move(t: Transition) -> RowMove:
    if t.dst == S.READY:
        return MarkReady(t.launch_id, t.queue, t.provider, t.reason)
    avoid = (AvoidHost(t.provider, t.host_id, t.reason),) if t.avoid_host and t.host_id else ()
    if t.warm == "miss" and t.dst == S.TERMINATING:
        return WarmMiss(t.launch_id, t.queue, t.provider, t.host_id, t.reason, then=avoid)
    then: list[Consequence] = []
    if t.handback:
        then.append(HandBack(t.launch_id, t.queue))
    if t.preempted:
        then.append(Preempted(t.launch_id, t.queue, t.provider, t.host_id, t.reason))
    if t.dst == S.BOOTING:
        then.append(CancelIfRequested(t.launch_id))
    then.append(Audit(t.launch_id, t.queue, t.src, t.dst, t.reason))
    if t.dst == S.STOPPED:
        then.append(WarmStopped(t.launch_id, t.queue, t.reason))
    elif t.warm == "miss":
        then.append(WarmLost(t.launch_id, t.queue, t.reason))
    if t.rental == "failed":
        then.append(BackOff(t.queue, t.provider, t.reason))
        then.extend(avoid)
    elif t.rental == "ok":
        then.append(EndBackoff(t.queue, t.provider))
    if t.silenced:
        return DestroySilent(
            t.launch_id, t.queue, t.provider, t.src, t.reason, t.heard_at, then=tuple(then)
        )
    return Move(
        t.launch_id,
        t.queue,
        t.provider,
        t.src,
        t.dst,
        t.reason,
        provider_instance_id=t.provider_instance_id,
        host_id=t.host_id,
        then=tuple(then),
    )

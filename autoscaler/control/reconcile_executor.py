"""The one place a `ReconcilePlan` becomes actions: reconcile's counterpart of `executor`.

`apply_reconcile` walks the plan in production's order — each move, and its consequences once
it held; the silences noted; the retries; the orphan sightings kept; the steps sent; the queues
evaluated; the orphans destroyed — and hands each action to a `ReconcileActions` port, one
method per action kind (`policy.reconcile_plan.ACTION_KINDS`). Production's port
(`control.reconcile_actions.StoreReconcileActions`) writes the store in the round's transaction
and sends the steps, avoided hosts and orphan destroys once it committed; the simulator's
(`sim.reconcile_port.SimReconcileActions`) changes its virtual world at once. Both therefore
carry out what `reconcile()` decided: timeouts, warm misses, hand-backs, silences.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, assert_never

from autoscaler.policy.reconcile_plan import (
    Audit,
    AvoidHost,
    BackOff,
    CancelIfRequested,
    Consequence,
    DestroyOrphan,
    DestroySilent,
    EndBackoff,
    Evaluate,
    HandBack,
    KeepOrphans,
    MarkReady,
    Move,
    NoteSilence,
    Preempted,
    ReconcilePlan,
    Retry,
    SendStep,
    WarmLost,
    WarmMiss,
    WarmStopped,
)


class ReconcileActions(Protocol):
    # ------------------------------------------------------------ moves
    def mark_ready(self, action: MarkReady) -> None:
        """booting or resuming -> ready: the one way, wherever its worker is seen."""

    def move(self, action: Move) -> bool:
        """The conditional move; True if it held (its consequences follow)."""

    def destroy_silent(self, action: DestroySilent) -> bool:
        """The conditional move for silence (no sign of life since `heard_at`); True if held."""

    def warm_miss(self, action: WarmMiss) -> bool:
        """resuming -> terminating, no backoff, its queue evaluated now; True if held."""

    # ------------------------------------------------------------ consequences of a move
    def hand_back(self, action: HandBack) -> None:
        """Its jobs go back to the broker (after the hand-back's grace)."""

    def preempted(self, action: Preempted) -> None:
        """Outbid: its event; its host avoided once it preempted enough of ours."""

    def cancel_if_requested(self, action: CancelIfRequested) -> None:
        """An adopted create an operator cancelled meanwhile is destroyed."""

    def audit(self, action: Audit) -> None:
        """The move's event."""

    def warm_stopped(self, action: WarmStopped) -> None:
        """Stopped for the warm pool: its warm event."""

    def warm_lost(self, action: WarmLost) -> None:
        """Lost while resuming: a warm miss (event, its queue evaluated now)."""

    def back_off(self, action: BackOff) -> None:
        """A failed rental: the (queue, provider) backoff grows."""

    def end_backoff(self, action: EndBackoff) -> None:
        """A rental that served: the (queue, provider) backoff ends."""

    def avoid_host(self, action: AvoidHost) -> None:
        """The provider avoids the host (after the round's transaction)."""

    # ------------------------------------------------------------ the rest of the round
    def note_silence(self, actions: Sequence[NoteSilence]) -> None:
        """Machines found silent for the first time (all of the round's at once)."""

    def retry(self, actions: Sequence[Retry]) -> None:
        """Steps sent again (all of the round's at once: audited once per stretch)."""

    def keep_orphans(self, action: KeepOrphans) -> None:
        """The orphans now seen, with their first sightings."""

    def send_step(self, action: SendStep) -> None:
        """The step that carries a move out (terminate, stop)."""

    def evaluate(self, action: Evaluate) -> None:
        """Evaluate the queue now."""

    def destroy_orphan(self, action: DestroyOrphan) -> None:
        """Destroy a machine with our label that no live row owns."""


def apply_reconcile(plan: ReconcilePlan, actions: ReconcileActions) -> None:
    """Hand every action of `plan` to `actions`, in production's order."""
    for m in plan.moves:
        if isinstance(m, MarkReady):
            actions.mark_ready(m)
            continue
        if isinstance(m, Move):
            held = actions.move(m)
        elif isinstance(m, DestroySilent):
            held = actions.destroy_silent(m)
        elif isinstance(m, WarmMiss):
            held = actions.warm_miss(m)
        else:
            assert_never(m)
        if held:
            for c in m.then:
                _consequence(c, actions)
    if plan.silences:
        actions.note_silence(plan.silences)
    actions.retry(plan.retries)
    actions.keep_orphans(KeepOrphans(plan.orphans or {}))
    for s in plan.steps:
        actions.send_step(s)
    for e in plan.evaluations:
        actions.evaluate(e)
    for d in plan.destroys:
        actions.destroy_orphan(d)


def _consequence(c: Consequence, actions: ReconcileActions) -> None:
    if isinstance(c, HandBack):
        actions.hand_back(c)
    elif isinstance(c, Preempted):
        actions.preempted(c)
    elif isinstance(c, CancelIfRequested):
        actions.cancel_if_requested(c)
    elif isinstance(c, Audit):
        actions.audit(c)
    elif isinstance(c, WarmStopped):
        actions.warm_stopped(c)
    elif isinstance(c, WarmLost):
        actions.warm_lost(c)
    elif isinstance(c, BackOff):
        actions.back_off(c)
    elif isinstance(c, EndBackoff):
        actions.end_backoff(c)
    elif isinstance(c, AvoidHost):
        actions.avoid_host(c)
    else:
        assert_never(c)


HANDLERS: dict[type, str] = {
    MarkReady: "mark_ready",
    Move: "move",
    DestroySilent: "destroy_silent",
    WarmMiss: "warm_miss",
    HandBack: "hand_back",
    Preempted: "preempted",
    CancelIfRequested: "cancel_if_requested",
    Audit: "audit",
    WarmStopped: "warm_stopped",
    WarmLost: "warm_lost",
    BackOff: "back_off",
    EndBackoff: "end_backoff",
    AvoidHost: "avoid_host",
    NoteSilence: "note_silence",
    Retry: "retry",
    KeepOrphans: "keep_orphans",
    SendStep: "send_step",
    Evaluate: "evaluate",
    DestroyOrphan: "destroy_orphan",
}
"""The port's method for each action kind (the completeness test checks it against
`policy.reconcile_plan.ACTION_KINDS`, the protocol and both ports)."""

"""Production's `ReconcileActions` port: reconcile's plan written to the store, in the round's
transaction (conditional moves, backoffs, hand-backs due, silences, retries' audits, orphan
sightings, events), and what must wait for its commit (avoided hosts, the steps through the
`Outbox`, queues evaluated, orphans destroyed) kept in order for `after_commit`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from autoscaler.access.credentials import CredentialError
from autoscaler.control import machines, rate_limits
from autoscaler.control.outbox import Outbox
from autoscaler.control.runtime import Loaded, Runtime, log
from autoscaler.control.steps import drain, handback
from autoscaler.control.steps.resume import avoid_host, warm_miss
from autoscaler.lifecycle import InstanceState
from autoscaler.policy.reconcile_plan import (
    Audit,
    AvoidHost,
    BackOff,
    CancelIfRequested,
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
    Retry,
    SendStep,
    WarmLost,
    WarmMiss,
    WarmStopped,
)
from autoscaler.providers.base import ProviderError
from autoscaler.store import backoffs, events, handbacks, moves, orphan_sightings
from autoscaler.store.db import Session

S = InstanceState

PREEMPTIONS_TO_AVOID = 2
"""Preemptions on one host within PREEMPTION_WINDOW that get it avoided for a while."""
PREEMPTION_WINDOW = timedelta(hours=24)


class StoreReconcileActions:
    """The port on the store: everything in `session`; `after_commit` sends the rest."""

    def __init__(self, session: Session, loaded: Loaded, now: datetime) -> None:
        self.session = session
        self.loaded = loaded
        self.now = now
        self.said: list[Any] = []
        self.cancelled: list[str] = []
        self.missed: set[str] = set()
        self.avoid: list[tuple[str, str, str]] = []
        self.retries: list[Retry] = []
        self.steps: list[SendStep] = []
        self.evaluations: set[str] = set()
        self.destroys: list[DestroyOrphan] = []

    # ------------------------------------------------------------ moves
    def mark_ready(self, action: MarkReady) -> None:
        a = action
        ready = machines.mark_ready(
            self.session, a.launch_id, a.queue, a.provider, self.now, a.reason
        )
        if ready and ready.slow_host is not None:  # a slow cold boot: avoid its host
            slow = ready.slow_host
            self.avoid.append((slow.provider, slow.host_id, slow.reason))

    def move(self, action: Move) -> bool:
        a = action
        fields: dict[str, Any] = {}
        if a.provider_instance_id is not None:
            fields["provider_instance_id"] = a.provider_instance_id
        if a.host_id is not None:
            fields["host_id"] = a.host_id
        return moves.move(self.session, a.launch_id, a.src, a.dst, self.now, a.reason, **fields)

    def destroy_silent(self, action: DestroySilent) -> bool:
        a = action
        only_if = moves.unheard_since(a.heard_at)  # it spoke meanwhile: it stays
        return moves.move(
            self.session, a.launch_id, a.src, S.TERMINATING, self.now, a.reason, only_if=only_if
        )

    def warm_miss(self, action: WarmMiss) -> bool:
        a = action
        if not warm_miss(self.session, a.launch_id, a.queue, a.host_id, a.reason):
            return False
        self.missed.add(a.queue)
        return True

    # ------------------------------------------------------------ consequences
    def hand_back(self, action: HandBack) -> None:
        handbacks.set_due(self.session, action.launch_id, self.now + handback.GRACE)

    def preempted(self, action: Preempted) -> None:
        a = action
        self.said.append(
            events.event(
                events.PREEMPTION_EVENT,
                "preempted",
                a.reason,
                queue=a.queue,
                launch_id=a.launch_id,
                details={"provider": a.provider, "host": a.host_id},
            )
        )
        self.avoid += _preempting_host(self.session, a, self.now)

    def cancel_if_requested(self, action: CancelIfRequested) -> None:
        if drain.cancel_if_requested(self.session, action.launch_id, self.now):
            self.cancelled.append(action.launch_id)

    def audit(self, action: Audit) -> None:
        a = action
        self.said.append(
            events.event(
                "reconcile",
                f"{a.src.value}->{a.dst.value}",
                a.reason,
                queue=a.queue,
                launch_id=a.launch_id,
            )
        )

    def warm_stopped(self, action: WarmStopped) -> None:
        a = action
        self.said.append(events.warm_event("stopped", a.reason, a.queue, a.launch_id))

    def warm_lost(self, action: WarmLost) -> None:
        a = action
        self.said.append(events.warm_event("miss", a.reason, a.queue, a.launch_id))
        self.missed.add(a.queue)

    def back_off(self, action: BackOff) -> None:
        a = action
        machines.rental_failed(
            self.session, a.queue, a.provider, self.now, self.loaded.config.backoff, a.reason
        )

    def end_backoff(self, action: EndBackoff) -> None:
        backoffs.clear(self.session, action.queue, action.provider)

    def avoid_host(self, action: AvoidHost) -> None:
        self.avoid.append((action.provider, action.host_id, action.reason))

    # ------------------------------------------------------------ the rest of the round
    def note_silence(self, actions: Sequence[NoteSilence]) -> None:
        moves.note_silence(self.session, [n.launch_id for n in actions], self.now)
        self.said += [
            events.event(
                "reconcile",
                "silent",
                f"{n.reason}: destroyed if the next round finds it silent too",
                queue=n.queue,
                launch_id=n.launch_id,
            )
            for n in actions
        ]

    def retry(self, actions: Sequence[Retry]) -> None:
        unnoted = moves.unnoted_retries(self.session, [(r.launch_id, r.step) for r in actions])
        for r in actions:
            # Audited once per stretch of retries (not on every reconcile while a drain waits).
            if r.launch_id in unnoted and moves.note_retry(
                self.session, r.launch_id, r.step, r.reason
            ):
                self.said.append(
                    events.event(
                        "reconcile",
                        f"retry_{r.step}",
                        r.reason,
                        queue=r.queue,
                        launch_id=r.launch_id,
                    )
                )
        self.retries.extend(actions)

    def keep_orphans(self, action: KeepOrphans) -> None:
        orphan_sightings.replace(self.session, action.sightings)

    def send_step(self, action: SendStep) -> None:
        self.steps.append(action)

    def evaluate(self, action: Evaluate) -> None:
        self.evaluations.add(action.queue)

    def destroy_orphan(self, action: DestroyOrphan) -> None:
        self.destroys.append(action)

    # ------------------------------------------------------------ the shell's
    def record(self) -> None:
        """The round's events, in the transaction (its last write)."""
        events.record(self.session, self.said, self.now)

    def after_commit(self, rt: Runtime, outbox: Outbox, due: Sequence[tuple[str, Any]]) -> int:
        """Once the round's transaction committed: hosts avoided, the retried steps and those
        the moves call for, the hand-backs `due`, queues evaluated now; then the orphans
        destroyed (returns how many)."""
        for provider, host, reason in self.avoid:
            avoid_host(rt, provider, host, reason)
        for r in self.retries:
            outbox.step(r.step, r.launch_id)
        for s in self.steps:
            outbox.step(s.step, s.launch_id)
        for launch_id in self.cancelled:
            outbox.step("terminate", launch_id)
        for launch_id, _ in due:  # a lost machine's jobs back to the broker (and again
            outbox.step("handback", launch_id)  # each round until done: a crash loses nothing)
        # a warm miss or a lost machine: a fresh machine is rented now, not a poll later
        for queue in sorted(self.missed | self.evaluations):
            outbox.evaluate(queue)
        return _destroy_orphans(rt, self.loaded, self.destroys, self.now)


def _preempting_host(session: Session, a: Preempted, now: datetime) -> list[tuple[str, str, str]]:
    """The host to avoid when it has now preempted our machines PREEMPTIONS_TO_AVOID times
    within PREEMPTION_WINDOW (this one included: its event is flushed with the round's)."""
    if not a.host_id:
        return []
    earlier = events.preemptions_on_host(session, a.provider, a.host_id, now - PREEMPTION_WINDOW)
    if earlier + 1 < PREEMPTIONS_TO_AVOID:
        return []
    return [(a.provider, a.host_id, f"preempted {earlier + 1} machines of ours within 24h")]


def _destroy_orphans(
    rt: Runtime, loaded: Loaded, destroys: Sequence[DestroyOrphan], now: datetime
) -> int:
    done = 0
    said = []
    for d in destroys:
        try:  # held: after its end the orphan is still listed, and still past its grace
            with rate_limits.answering(rt, d.provider, loaded):
                rt.provider(d.provider).destroy(d.provider_instance_id)
        except rate_limits.Held:
            continue
        except (ProviderError, CredentialError, KeyError) as exc:
            log.warning("orphan %s not destroyed: %s", d.provider_instance_id, exc)
            continue
        done += 1
        said.append(
            events.event(
                "reconcile",
                "destroy_orphan",
                f"{d.label}: {d.reason}",
                details={"provider": d.provider, "id": d.provider_instance_id},
            )
        )
    if said:
        with rt.transaction() as session:
            events.record(session, said, now)
    return done

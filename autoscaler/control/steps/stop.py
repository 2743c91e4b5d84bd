"""Stop: put a drained machine in its queue's warm pool — its credentials dead, its machine
stopped at the provider with its disk kept.

Reached only from `stopping`, which a row enters once drained (never with work on it) and only
when `decide()` gave it a place in the pool. Its broker user is deleted first and its worker
token opens nothing from `stopping` on (`lifecycle.TOKEN_STATES`): a stopped machine holds no
live credential. The provider's stop is asynchronous at most providers; the row becomes
`stopped` when the provider lists it so (here, or at reconcile, which also retries a stop that
failed — a 409, a 5xx, a lost answer — and destroys a machine whose stop never takes:
`policy.reconcile.STOP_TIMEOUT`).
"""

from __future__ import annotations

from autoscaler.control.steps.credentials import drop_broker_user
from autoscaler.control.steps.frame import Kind, Outcome, Step, StepRead, done, waiting
from autoscaler.lifecycle import InstanceState, MachineStatus
from autoscaler.providers.base import Provider, ProviderMachine
from autoscaler.store import events
from autoscaler.store.db import Session

S = InstanceState


class StopStep(Step[None]):
    """Stop one drained machine for its queue's warm pool (one attempt, idempotent)."""

    name = "stop"
    starts = frozenset({S.STOPPING})
    doing = "stopping"

    def read(self, session: Session, m: StepRead) -> None:
        return None

    def act(self, m: StepRead, kept: None) -> Outcome:
        pid = m.row.provider_instance_id
        if pid is None:
            return _destroy_instead(m, "it has no provider id to stop")
        if not drop_broker_user(m.rt, m.launch_id, m.queue):
            return waiting("its broker user is not deleted yet (no live credential while stopped)")

        def stop(provider: Provider) -> ProviderMachine | Outcome | None:
            if not provider.can_stop:
                return _destroy_instead(m, f"{m.row.provider} cannot stop machines")
            provider.stop(pid)
            return provider.get(pid)

        after = m.call(stop)
        if isinstance(after, Outcome):
            return after
        if after is None or after.status != MachineStatus.STOPPED:
            shown = after.status.value if after is not None else "not listed"
            return Outcome(
                Kind.LEFT,
                f"stopping: {pid} is {shown} at the provider; reconcile confirms the stop",
            )
        fields = {}
        if after.storage_price_per_hour is not None:
            fields["storage_price_per_hour"] = after.storage_price_per_hour
        why = "stopped at the provider, its disk kept for the warm pool"
        said = events.warm_event("stopped", why, m.queue, m.launch_id)
        m.move(S.STOPPING, S.STOPPED, why, [said], **fields)
        return done("stopped")


def _destroy_instead(m: StepRead, why: str) -> Outcome:
    """No place in the pool after all: the machine is destroyed, as any drained one."""
    reason = f"not kept warm: {why}; destroyed instead"
    said = events.warm_event("destroy", reason, m.queue, m.launch_id)
    moved = m.move(S.STOPPING, S.TERMINATING, reason, [said])
    return Outcome(Kind.ABANDONED, reason, ("terminate",) if moved else ())


STEP = StopStep()

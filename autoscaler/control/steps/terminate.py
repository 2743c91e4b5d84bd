"""Terminate: destroy a machine and close its row only once the provider confirms it is gone.

Reached only from `terminating`, which a row enters when drained, dead, silent or never ready
(never straight from serving for a scale-down). A failed or unconfirmed destroy leaves the row
terminating; reconcile sends this step again until the provider no longer lists it (held or
late: once the hold has ended).
"""

from __future__ import annotations

from autoscaler.access import keys
from autoscaler.brokers import users as broker_users
from autoscaler.control.runtime import log
from autoscaler.control.steps.frame import Outcome, Step, StepRead, done, waiting
from autoscaler.lifecycle import InstanceState, MachineStatus
from autoscaler.providers.base import Provider
from autoscaler.providers.labels import make_label
from autoscaler.store import events
from autoscaler.store.db import Session

S = InstanceState


class TerminateStep(Step[str]):
    """Destroy one machine, until the provider confirms it is gone; then close its row."""

    name = "terminate"
    starts = frozenset({S.TERMINATING})
    doing = "terminating"

    def read(self, session: Session, m: StepRead) -> str:
        """The worker token dies first (the machine can call nothing any more); kept: the
        machine's label, to find it by when the row has no provider id."""
        keys.revoke_worker_token(session, m.launch_id)
        return make_label(m.rt.installation_id(session), m.launch_id)

    def act(self, m: StepRead, label: str) -> Outcome:
        def destroy(provider: Provider) -> str | Outcome | None:
            pid = m.row.provider_instance_id
            if pid is None:
                found = provider.find_by_label(label)
                pid = found.provider_instance_id if found is not None else None
            if pid is not None:
                provider.destroy(pid)
                after = provider.get(pid)
                if after is not None and after.status != MachineStatus.GONE:
                    return waiting(f"{pid} is still {after.status.value} at the provider")
            return pid

        pid = m.call(destroy)
        if isinstance(pid, Outcome):
            return pid
        if m.row.broker_user and not _broker_user_deleted(m, m.row.broker_user):
            return waiting("its broker user is not deleted yet")
        said = events.event(
            "terminate",
            "destroyed",
            f"{m.row.provider} destroyed {pid or label}",
            queue=m.queue,
            launch_id=m.launch_id,
        )
        m.move(S.TERMINATING, S.TERMINATED, "destroyed", [said], broker_user=None)
        return done("terminated")


def _broker_user_deleted(m: StepRead, user: str) -> bool:
    """False while its broker cannot be reached (the step waits); a broker no longer known
    cannot be reached from here at all: logged, and the machine is closed anyway."""
    queue_cfg = m.queue_cfg
    try:
        deleted = queue_cfg is not None and broker_users.delete_machine_user(
            queue_cfg.metrics, user, m.rt.env
        )
        if not deleted:
            log.error("terminate %s: broker user %s left behind", m.launch_id, user)
    except Exception as exc:
        log.warning("terminate %s: broker user not deleted yet: %s", m.launch_id, exc)
        return False
    return True


STEP = TerminateStep()

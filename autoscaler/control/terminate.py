"""Terminate: destroy a machine and close its row only once the provider confirms it is gone.

Reached only from `terminating`, which a row enters when drained, dead, silent or never ready
(never straight from serving for a scale-down). A failed or unconfirmed destroy leaves the row
terminating; reconcile enqueues this step again until the provider no longer lists it.
"""

from __future__ import annotations

from autoscaler.access import broker_users, keys
from autoscaler.access.credentials import CredentialError
from autoscaler.control import rate_limits
from autoscaler.control.runtime import Runtime, log, utc_now
from autoscaler.lifecycle import InstanceState, MachineStatus
from autoscaler.providers.base import ProviderError
from autoscaler.providers.labels import make_label
from autoscaler.store import events, instances, moves

S = InstanceState


def run_terminate(rt: Runtime, launch_id: str) -> str:
    with rt.transaction() as session:
        row = instances.get(session, launch_id)
        if row is None or row.state != S.TERMINATING:
            return f"not terminating ({row.state.value if row else 'no such machine'})"
        # the provider and queue it was rented under (a provider since renamed or removed
        # still destroys its machine), else the newest config
        loaded = rt.load_for(session, row.config_version)
        queue, provider_name, pid = row.queue, row.provider, row.provider_instance_id
        broker_user = row.broker_user
        keys.revoke_worker_token(session, launch_id)  # the machine can call nothing any more
        label = make_label(rt.installation_id(session), launch_id)
    try:  # held or late: reconcile enqueues this step again once the hold has ended
        with rate_limits.answering(rt, provider_name, loaded, queue):
            provider = rt.provider(provider_name, loaded)
            if pid is None:
                found = provider.find_by_label(label)
                pid = found.provider_instance_id if found is not None else None
            if pid is not None:
                provider.destroy(pid)
                after = provider.get(pid)
                if after is not None and after.status != MachineStatus.GONE:
                    return f"waiting: {pid} is still {after.status.value} at the provider"
    except rate_limits.Held as held:
        return held.waiting
    except (ProviderError, CredentialError, KeyError) as exc:
        log.warning("terminate %s: %s", launch_id, exc)
        return f"waiting: {str(exc)[:300]}"
    if broker_user:
        queue_cfg = loaded.config.queues.get(queue) if loaded else None
        try:
            deleted = queue_cfg is not None and broker_users.delete_machine_user(
                queue_cfg.metrics, broker_user, rt.env
            )
            if not deleted:  # its broker is no longer known: cannot be reached from here
                log.error("terminate %s: broker user %s left behind", launch_id, broker_user)
        except Exception as exc:
            log.warning("terminate %s: broker user not deleted yet: %s", launch_id, exc)
            return "waiting: its broker user is not deleted yet"
    now = utc_now()
    with rt.transaction() as session:
        if moves.move(
            session, launch_id, S.TERMINATING, S.TERMINATED, now, "destroyed", broker_user=None
        ):
            events.record(
                session,
                [
                    events.event(
                        "terminate",
                        "destroyed",
                        f"{provider_name} destroyed {pid or label}",
                        queue=queue,
                        launch_id=launch_id,
                    )
                ],
                now,
            )
    return "terminated"

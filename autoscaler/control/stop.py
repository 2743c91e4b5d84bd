"""Stop: put a drained machine in its queue's warm pool — its credentials dead, its machine
stopped at the provider with its disk kept.

Reached only from `stopping`, which a row enters once drained (never with work on it) and only
when `decide()` gave it a place in the pool. Its broker user is deleted first and its worker
token opens nothing from `stopping` on (`access.keys.TOKEN_STATES`): a stopped machine holds no
live credential. The provider's stop is asynchronous at most providers; the row becomes
`stopped` when the provider lists it so (here, or at reconcile, which also retries a stop that
failed — a 409, a 5xx, a lost answer — and destroys a machine whose stop never takes:
`policy.reconcile.STOP_TIMEOUT`).
"""

from __future__ import annotations

from collections.abc import Callable

from autoscaler.access.credentials import CredentialError
from autoscaler.control import rate_limits
from autoscaler.control.launch import drop_broker_user
from autoscaler.control.runtime import Runtime, log, utc_now
from autoscaler.lifecycle import InstanceState, MachineStatus
from autoscaler.providers.base import ProviderError
from autoscaler.store import events, instances, moves

S = InstanceState


def run_stop(rt: Runtime, launch_id: str, enqueue: Callable[[str, str], None] | None = None) -> str:
    """One attempt (idempotent); returns where it stands."""
    with rt.transaction() as session:
        row = instances.get(session, launch_id)
        if row is None or row.state != S.STOPPING:
            return f"not stopping ({row.state.value if row else 'no such machine'})"
        loaded = rt.load_for(session, row.config_version)
        queue, provider_name, pid = row.queue, row.provider, row.provider_instance_id
    if pid is None:
        return _destroy_instead(rt, launch_id, queue, "it has no provider id to stop", enqueue)
    if not drop_broker_user(rt, launch_id, queue):
        return "waiting: its broker user is not deleted yet (no live credential while stopped)"
    try:
        with rate_limits.answering(rt, provider_name, loaded, queue):
            provider = rt.provider(provider_name, loaded)
            if not provider.can_stop:
                why = f"{provider_name} cannot stop machines"
                return _destroy_instead(rt, launch_id, queue, why, enqueue)
            provider.stop(pid)
            after = provider.get(pid)
    except rate_limits.Held as held:
        return held.waiting
    except (ProviderError, CredentialError, KeyError) as exc:
        log.warning("stop %s: %s", launch_id, exc)
        return f"waiting: {str(exc)[:300]}"
    if after is None or after.status != MachineStatus.STOPPED:
        shown = after.status.value if after is not None else "not listed"
        return f"stopping: {pid} is {shown} at the provider; reconcile confirms the stop"
    now = utc_now()
    with rt.transaction() as session:
        fields = {}
        if after.storage_price_per_hour is not None:
            fields["storage_price_per_hour"] = after.storage_price_per_hour
        why = "stopped at the provider, its disk kept for the warm pool"
        if moves.move(session, launch_id, S.STOPPING, S.STOPPED, now, why, **fields):
            events.record(session, [events.warm_event("stopped", why, queue, launch_id)], now)
    return "stopped"


def _destroy_instead(
    rt: Runtime,
    launch_id: str,
    queue: str,
    why: str,
    enqueue: Callable[[str, str], None] | None,
) -> str:
    """No place in the pool after all: the machine is destroyed, as any drained one."""
    now = utc_now()
    reason = f"not kept warm: {why}; destroyed instead"
    with rt.transaction() as session:
        moved = moves.move(session, launch_id, S.STOPPING, S.TERMINATING, now, reason)
        if moved:
            events.record(session, [events.warm_event("destroy", reason, queue, launch_id)], now)
    if moved and enqueue is not None:
        enqueue("terminate", launch_id)
    return reason

"""Resume: start a stopped machine of a warm pool again (the tick moved it `stopped ->
resuming` in its decision's transaction, as it writes a launch intent).

The provider's start, then the machine's agent starts again: its worker token opens the API
again from `resuming` on, its broker user is made again when it asks for its deployment
(`api/routers/worker.py`), and it is ready at its worker's first proof of life
(`machines.mark_ready`: a warm hit). A start refused because the machine's GPU or host is gone is
a warm miss: the machine is destroyed, its host avoided, and the queue evaluated at once so a
fresh machine is rented without waiting for the next poll (a miss is not a failed rental: no
backoff). A start that does not answer is retried by reconcile until `resume_timeout`.
"""

from __future__ import annotations

from collections.abc import Callable

from autoscaler.access.credentials import CredentialError
from autoscaler.control import rate_limits
from autoscaler.control.runtime import Runtime, log, utc_now
from autoscaler.lifecycle import InstanceState
from autoscaler.providers.base import ProviderError, ResumeRefusedError
from autoscaler.store import events, instances, moves
from autoscaler.store.db import Session

S = InstanceState
Enqueue = Callable[[str, str], None]


def run_resume(rt: Runtime, launch_id: str, enqueue: Enqueue | None = None) -> str:
    """One attempt (idempotent: a start of a running machine succeeds); where it stands."""
    with rt.transaction() as session:
        row = instances.get(session, launch_id)
        if row is None or row.state != S.RESUMING:
            return f"not resuming ({row.state.value if row else 'no such machine'})"
        loaded = rt.load_for(session, row.config_version)
        queue, provider_name, pid = row.queue, row.provider, row.provider_instance_id
        host = row.host_id
    try:
        with rate_limits.answering(rt, provider_name, loaded, queue):
            provider = rt.provider(provider_name, loaded)
            if pid is None:
                raise ResumeRefusedError("it has no provider id to start", provider=provider_name)
            provider.start(pid)
    except rate_limits.Held as held:
        return held.waiting
    except ResumeRefusedError as exc:
        with rt.transaction() as session:
            missed = warm_miss(session, launch_id, queue, host, str(exc))
        if missed:
            avoid_host(rt, provider_name, host, f"warm miss: {exc}")
        if missed and enqueue is not None:
            enqueue("terminate", launch_id)
            enqueue("evaluate", queue)
        return f"warm miss: {str(exc)[:300]}"
    except (ProviderError, CredentialError, KeyError) as exc:
        log.warning("resume %s: %s", launch_id, exc)
        return f"waiting: {str(exc)[:300]}"
    return "resuming: started at the provider; ready when its worker speaks"


def warm_miss(session: Session, launch_id: str, queue: str, host: str | None, why: str) -> bool:
    """resuming -> terminating for a resume that failed, with its event; no backoff. True if
    this call made the move (the caller then avoids its host, after the commit)."""
    now = utc_now()
    reason = f"warm miss: {why[:500]}"
    if not moves.move(session, launch_id, S.RESUMING, S.TERMINATING, now, reason):
        return False
    events.record(session, [events.warm_event("miss", reason, queue, launch_id, host=host)], now)
    return True


def avoid_host(rt: Runtime, provider: str, host: str | None, reason: str) -> None:
    """Misses and failed boots per host feed the provider's avoided hosts (best effort). Called
    after the transaction that recorded the failure: the avoided hosts are written on a
    connection of their own, which an open write would hold up (SQLite's one writer)."""
    if not host:
        return
    try:
        rt.provider(provider).avoid_host(host, reason)
    except Exception:  # avoiding a host is best effort
        log.warning("could not mark host %s avoided", host, exc_info=True)

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

from autoscaler.control.runtime import Runtime, log, utc_now
from autoscaler.control.steps.frame import Kind, Outcome, Step, StepRead, done
from autoscaler.lifecycle import InstanceState
from autoscaler.providers.base import Provider, ResumeRefusedError
from autoscaler.store import events, moves
from autoscaler.store.db import Session

S = InstanceState


class ResumeStep(Step[None]):
    """One attempt (idempotent: a start of a running machine succeeds)."""

    name = "resume"
    starts = frozenset({S.RESUMING})
    doing = "resuming"

    def read(self, session: Session, m: StepRead) -> None:
        return None

    def act(self, m: StepRead, kept: None) -> Outcome:
        def start(provider: Provider) -> None:
            pid = m.row.provider_instance_id
            if pid is None:
                raise ResumeRefusedError("it has no provider id to start", provider=m.row.provider)
            provider.start(pid)

        try:
            started = m.call(start, passes=(ResumeRefusedError,))
        except ResumeRefusedError as exc:
            return _missed(m, exc)
        if isinstance(started, Outcome):
            return started
        return done("resuming: started at the provider; ready when its worker speaks")


def _missed(m: StepRead, exc: ResumeRefusedError) -> Outcome:
    """A warm miss: the machine destroyed, its host avoided, its queue evaluated now."""
    host = m.row.host_id
    with m.rt.transaction() as session:
        missed = warm_miss(session, m.launch_id, m.queue, host, str(exc))
    if missed:
        avoid_host(m.rt, m.row.provider, host, f"warm miss: {exc}")
    text = f"warm miss: {str(exc)[:300]}"
    if not missed:
        return Outcome(Kind.ABANDONED, text)
    return Outcome(Kind.ABANDONED, text, ("terminate",), evaluate=m.queue)


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


STEP = ResumeStep()

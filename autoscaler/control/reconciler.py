"""Reconcile, the shell around the pure `policy.reconcile`: observe, compare, mend.

0. take the reconcile lease: rounds never overlap (beat sends one every poll; a round still
   running makes the next one return at once, holding no lifecycle slot);
1. note each live row's state and since, then list every provider's machines with our label,
   in parallel, each under its own deadline (`list_deadline`), while the workers are observed
   (the worker-status port): a provider that does not answer is unread this round and held
   for the lifecycle steps (`rate_limits`), and delays no other;
2. read the rows again: those that moved while the lists were taken are `unsettled`, judged by
   no list this round (a listing is evidence only about what existed before it);
   `reconcile()` turns rows + lists + orphan sightings into moves, retries and orphan destroys;
3. apply the moves (conditional writes), backoffs, avoided hosts and events in one transaction;
4. send the retried steps; destroy orphans past their grace time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime, timedelta
from typing import Any

from autoscaler.access.credentials import CredentialError
from autoscaler.control import machines, rate_limits
from autoscaler.control.observe import observe_celery_workers
from autoscaler.control.outbox import Outbox
from autoscaler.control.runtime import Loaded, Runtime, collector_paused, log
from autoscaler.control.steps import drain, handback
from autoscaler.control.steps.resume import avoid_host, warm_miss
from autoscaler.lifecycle import InstanceState
from autoscaler.policy.reconcile import Listed, ProviderView, ReconcilePlan, reconcile, unsettled
from autoscaler.providers import http
from autoscaler.providers.base import ProviderError, RateLimitedError, UnansweredError
from autoscaler.store import backoffs, events, handbacks, instances, leases, moves, orphan_sightings
from autoscaler.store.db import Session, store_now

S = InstanceState


def run_reconcile(rt: Runtime, outbox: Outbox, now: datetime | None = None) -> dict[str, Any]:
    """One round. Silence is judged on the store's clock (`store_now`), the clock heartbeats
    and sightings are stamped with, never this process's own. The cycle collector waits for
    the round's end (`collector_paused`: 0.9 s of a 3.8 s round at 20,000 machines)."""
    with collector_paused():
        return _run_reconcile(rt, outbox, now)


def _run_reconcile(rt: Runtime, outbox: Outbox, now: datetime | None) -> dict[str, Any]:
    with leases.exclusive_round(rt.engine, "reconcile", rt.settings.home) as mine:
        if not mine:
            return {"skipped": "a reconcile round is running"}
        with rt.transaction() as session:
            loaded = rt.load(session)
            now = now or store_now(session)
        if loaded is None:
            return {"skipped": "no config"}
        return _round(rt, outbox, loaded, now)


def _round(rt: Runtime, outbox: Outbox, loaded: Loaded, now: datetime) -> dict[str, Any]:
    with rt.transaction() as session:
        before = instances.states_since(session)
    views = list_providers(rt, loaded, meanwhile=lambda: observe_celery_workers(rt, loaded, now))
    with rt.transaction() as session:
        live = instances.live_rows(session)
        listed_ids = {m.launch_id for v in views.values() for m in v.machines}
        closed = instances.rows_of(session, listed_ids - {r.launch_id for r in live})
        rows = tuple(instances.as_row(r) for r in [*live, *closed])
        moved = unsettled(rows, before)
        seen = orphan_sightings.seen(session)
        plan = reconcile(rows, views, seen, loaded.config, now, moved)
        cancelled, missed, avoid = _apply(session, loaded, plan, now)
        due = handbacks.pending(session)
    for provider, host, reason in avoid:
        avoid_host(rt, provider, host, reason)
    for r in plan.retries:
        outbox.step(r.step, r.launch_id)
    for t in plan.transitions:
        if t.dst == S.TERMINATING:
            outbox.step("terminate", t.launch_id)
        elif t.dst == S.STOPPING:
            outbox.step("stop", t.launch_id)
    for launch_id in cancelled:
        outbox.step("terminate", launch_id)
    for launch_id, _ in due:  # a lost machine's jobs back to the broker (and again
        outbox.step("handback", launch_id)  # each round until done: a crash loses nothing)
    # a warm miss or a lost machine: a fresh machine is rented now, not a poll later
    for queue in sorted(missed | {t.queue for t in plan.transitions if t.handback}):
        outbox.evaluate(queue)
    destroyed = _destroy_orphans(rt, loaded, plan, now)
    _sweep_broker_users(rt, loaded, {r.launch_id for r in live})
    return {
        "transitions": len(plan.transitions),
        "retries": len(plan.retries),
        "orphans_destroyed": destroyed,
        "providers_unreadable": sorted(n for n, v in views.items() if not v.listed),
        "unsettled": len(moved),
    }


def _sweep_broker_users(rt: Runtime, loaded: Loaded, live: set[str]) -> None:
    """Per-machine broker users whose machine has no live row are deleted (never a failure of
    the round: a broker that cannot be reached is tried again next time)."""
    from autoscaler.brokers import users as broker_users

    with rt.transaction() as session:
        install = rt.installation_id(session)
    try:
        gone = broker_users.sweep(loaded.config, install, live, rt.env)
    except Exception as exc:
        log.warning("broker users not swept: %s", type(exc).__name__)
        return
    if gone:
        log.info("deleted %d broker user(s) of machines no longer live", len(gone))


def list_deadline(poll_interval: float) -> float:
    """How long a round waits for each provider's list: `rate_limits.call_deadline`, the bound
    every lifecycle step's provider calls get too (10 s at the default 30 s poll). The list
    runs under it (its HTTP client's 30 s reads and retries cut short)."""
    return rate_limits.call_deadline(poll_interval)


_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="reconcile-list")
_IN_FLIGHT: dict[tuple[int, str, Any], Future[Any]] = {}
"""Each provider's listing still running in this process, by (runtime, name, its config): one
not answered by its deadline is not started again while it runs, so a silent provider holds
one thread, not one a round; a provider whose config changed is a new one."""
_IN_FLIGHT_LOCK = threading.Lock()


def list_providers(
    rt: Runtime,
    loaded: Loaded,
    deadline: float | None = None,
    meanwhile: Callable[[], object] | None = None,
) -> dict[str, ProviderView]:
    """Each provider's machines with our label, all listed at once, each within `deadline`
    seconds (`list_deadline` of the poll interval by default), while `meanwhile` runs (the
    round's worker observation: a round takes the longer of the two, not their sum, so one
    silent provider never makes it outlast a short poll). A failing or late list gives
    `listed=False`, and so does a provider whose rate limit is in force (it is not called
    until its reset) or whose previous list has not answered yet."""
    wait = list_deadline(loaded.config.poll_interval) if deadline is None else deadline
    views: dict[str, ProviderView] = {}
    started: dict[str, Future[Any]] = {}
    for name in loaded.config.providers:
        hold = rate_limits.current(rt, name)
        if hold is not None and hold.cause == "rate_limit":  # a no-answer hold is still listed:
            views[name] = ProviderView(name, listed=False)  # its list is the probe that lifts it
            continue
        key = (id(rt), name, loaded.config.providers[name])
        with _IN_FLIGHT_LOCK:
            running = _IN_FLIGHT.get(key)
            if running is not None and not running.done():
                log.warning("reconcile: %s has not answered its last list yet: unread", name)
                rate_limits.note_unanswered(rt, name, f"{name} has not answered its last list")
                views[name] = ProviderView(name, listed=False)
                continue
            for old in [k for k, f in _IN_FLIGHT.items() if f.done()]:
                del _IN_FLIGHT[old]
            future = _POOL.submit(_list_one, rt, name, loaded, wait)
            _IN_FLIGHT[key] = future
        started[name] = future
    end = time.monotonic() + wait  # all started at once: one deadline for all
    if meanwhile is not None:
        meanwhile()
    for name, future in started.items():
        views[name] = _view(rt, loaded, name, future, max(0.0, end - time.monotonic()), wait)
    return views


def _list_one(rt: Runtime, name: str, loaded: Loaded, wait: float) -> Any:
    with http.deadline(wait):
        return rt.provider(name, loaded).list_owned()


def _view(
    rt: Runtime, loaded: Loaded, name: str, future: Future[Any], left: float, wait: float
) -> ProviderView:
    try:
        listed = future.result(timeout=left)
    except (FutureTimeout, UnansweredError):
        log.warning("reconcile: %s did not list within %.0fs: unread this round", name, wait)
        rate_limits.note_unanswered(rt, name, f"its list got no answer within {wait:.0f}s")
        return ProviderView(name, listed=False)
    except RateLimitedError as exc:
        rate_limits.note(rt, name, exc)
        return ProviderView(name, listed=False)
    except (ProviderError, CredentialError, KeyError, ValueError) as exc:
        log.warning("reconcile: cannot list %s: %s", name, str(exc)[:300])
        return ProviderView(name, listed=False)
    rate_limits.answered(rt, name)
    return ProviderView(
        name,
        listed=True,
        machines=tuple(
            Listed(m.provider_instance_id, m.launch_id, m.label, m.status, m.host_id, m.raw_status)
            for m in listed
            if m.launch_id is not None
        ),
        ready_when_running=loaded.config.providers[name].ready_when_running,
    )


def _apply(
    session: Session, loaded: Loaded, plan: ReconcilePlan, now: datetime
) -> tuple[list[str], set[str], list[tuple[str, str, str]]]:
    """Carry the plan's moves out; returns the launches to destroy beyond the plan's own (a
    create adopted by label that an operator had cancelled meanwhile), the queues whose warm
    pool missed (evaluated at once), and the (provider, host, reason) to avoid once this
    transaction is committed."""
    said = []
    cancelled: list[str] = []
    missed: set[str] = set()
    avoid: list[tuple[str, str, str]] = []
    for t in plan.transitions:
        if t.dst == S.READY:  # the one way a machine becomes ready, wherever it is seen
            ready = machines.mark_ready(session, t.launch_id, t.queue, t.provider, now, t.reason)
            if ready and ready.slow_host is not None:  # a slow cold boot: avoid its host
                slow = ready.slow_host
                avoid.append((slow.provider, slow.host_id, slow.reason))
            continue
        if t.warm == "miss" and t.dst == S.TERMINATING:
            if warm_miss(session, t.launch_id, t.queue, t.host_id, t.reason):
                missed.add(t.queue)
                if t.avoid_host and t.host_id:
                    avoid.append((t.provider, t.host_id, t.reason))
            continue
        fields: dict[str, Any] = {}
        if t.provider_instance_id is not None:
            fields["provider_instance_id"] = t.provider_instance_id
        if t.host_id is not None:
            fields["host_id"] = t.host_id
        only_if = moves.unheard_since(t.heard_at) if t.silenced else None
        if not moves.move(
            session, t.launch_id, t.src, t.dst, now, t.reason, only_if=only_if, **fields
        ):
            continue  # someone moved it first (or, for silence, it spoke meanwhile)
        if t.handback:
            handbacks.set_due(session, t.launch_id, now + handback.GRACE)
        if t.preempted:
            said.append(
                events.event(
                    events.PREEMPTION_EVENT,
                    "preempted",
                    t.reason,
                    queue=t.queue,
                    launch_id=t.launch_id,
                    details={"provider": t.provider, "host": t.host_id},
                )
            )
            avoid += _preempting_host(session, t, now)
        if t.dst == S.BOOTING and drain.cancel_if_requested(session, t.launch_id, now):
            cancelled.append(t.launch_id)
        said.append(
            events.event(
                "reconcile",
                f"{t.src.value}->{t.dst.value}",
                t.reason,
                queue=t.queue,
                launch_id=t.launch_id,
            )
        )
        if t.dst == S.STOPPED:
            said.append(events.warm_event("stopped", t.reason, t.queue, t.launch_id))
        elif t.warm == "miss":  # lost while resuming
            said.append(events.warm_event("miss", t.reason, t.queue, t.launch_id))
            missed.add(t.queue)
        if t.rental == "failed":
            machines.rental_failed(
                session, t.queue, t.provider, now, loaded.config.backoff, t.reason
            )
            if t.avoid_host and t.host_id:
                avoid.append((t.provider, t.host_id, t.reason))
        elif t.rental == "ok":
            backoffs.clear(session, t.queue, t.provider)
    if plan.silences:
        moves.note_silence(session, [n.launch_id for n in plan.silences], now)
        said += [
            events.event(
                "reconcile",
                "silent",
                f"{n.reason}: destroyed if the next round finds it silent too",
                queue=n.queue,
                launch_id=n.launch_id,
            )
            for n in plan.silences
        ]
    unnoted = moves.unnoted_retries(session, [(r.launch_id, r.step) for r in plan.retries])
    for r in plan.retries:
        # Audited once per stretch of retries (not on every reconcile while a drain waits).
        if r.launch_id in unnoted and moves.note_retry(session, r.launch_id, r.step, r.reason):
            said.append(
                events.event(
                    "reconcile", f"retry_{r.step}", r.reason, queue=r.queue, launch_id=r.launch_id
                )
            )
    orphan_sightings.replace(session, plan.orphans)
    events.record(session, said, now)
    return cancelled, missed, avoid


PREEMPTIONS_TO_AVOID = 2
"""Preemptions on one host within PREEMPTION_WINDOW that get it avoided for a while."""
PREEMPTION_WINDOW = timedelta(hours=24)


def _preempting_host(session: Session, t: Any, now: datetime) -> list[tuple[str, str, str]]:
    """The host to avoid when it has now preempted our machines PREEMPTIONS_TO_AVOID times
    within PREEMPTION_WINDOW (this one included: its event is flushed with the round's)."""
    if not t.host_id:
        return []
    earlier = events.preemptions_on_host(session, t.provider, t.host_id, now - PREEMPTION_WINDOW)
    if earlier + 1 < PREEMPTIONS_TO_AVOID:
        return []
    return [(t.provider, t.host_id, f"preempted {earlier + 1} machines of ours within 24h")]


def _destroy_orphans(rt: Runtime, loaded: Loaded, plan: ReconcilePlan, now: datetime) -> int:
    done = 0
    said = []
    for d in plan.destroys:
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

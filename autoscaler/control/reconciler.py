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
3. hand the plan to production's port (`reconcile_actions.StoreReconcileActions`) through the
   applier shared with the simulator (`reconcile_executor.apply_reconcile`): the moves
   (conditional writes), backoffs, hand-backs, silences and events in one transaction;
4. once committed: avoided hosts, the retried steps and those the moves call for, queues
   evaluated; orphans past their grace time destroyed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime
from typing import Any

from autoscaler.access.credentials import CredentialError
from autoscaler.control import rate_limits
from autoscaler.control.observe import observe_celery_workers
from autoscaler.control.outbox import Outbox
from autoscaler.control.reconcile_actions import StoreReconcileActions
from autoscaler.control.reconcile_executor import apply_reconcile
from autoscaler.control.runtime import Loaded, Runtime, collector_paused, log
from autoscaler.policy.reconcile import Listed, ProviderView, ReconcilePlan, reconcile, unsettled
from autoscaler.providers import http
from autoscaler.providers.base import ProviderError, RateLimitedError, UnansweredError
from autoscaler.store import handbacks, instances, leases, orphan_sightings
from autoscaler.store.db import Session, store_now


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
        port = _apply(session, loaded, plan, now)
        due = handbacks.pending(session)
    destroyed = port.after_commit(rt, outbox, due)
    _sweep_broker_users(rt, loaded, {r.launch_id for r in live})
    return {
        "transitions": len(plan.transitions),
        "retries": len(plan.retries),
        "orphans_destroyed": destroyed,
        "providers_unreadable": sorted(n for n, v in views.items() if not v.listed),
        "unsettled": len(moved),
    }


def _apply(
    session: Session, loaded: Loaded, plan: ReconcilePlan, now: datetime
) -> StoreReconcileActions:
    """The plan through production's port, in the round's transaction (its events last); the
    port then holds what waits for the commit."""
    port = StoreReconcileActions(session, loaded, now)
    apply_reconcile(plan, port)
    port.record()
    return port


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

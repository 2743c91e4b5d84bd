"""reconcile(rows, providers, orphans, config, now) -> ReconcilePlan: mend records and machines.

The pure half of the reconciler (Ray autoscaler v2's instance manager is the model): it compares
our rows with what each provider lists under our label and with the last signs of life of the
workers, and proposes moves along `lifecycle.ALLOWED_TRANSITIONS`, each with its reason:

- a create whose outcome is unknown (worker killed mid-call, 5xx, timeout) is adopted when its
  label shows up, and failed after `CREATE_GRACE` if it never does;
- booting: worker seen -> ready; dead or gone at the provider, or no worker by the boot
  timeout -> terminate (a failed rental: backoff, host avoided);
- ready or draining: gone -> lost; dead at the provider, or silent past the heartbeat timeout
  -> terminate (a worker whose last word was "busy", or that only remote control sees, on a
  machine the provider still lists as running, gets drain_timeout: a busy solo-pool worker
  cannot answer, and may have taken its job just after it was last seen idle). These are the only
  ways a machine whose worker may be busy is destroyed;
- drained -> terminating, or -> stopping when `decide()` gave it a place in its queue's warm
  pool; terminating -> terminated once the provider no longer lists it;
- warm pools: stopping -> stopped once the provider lists it stopped (the stop retried, and
  destroyed if it never takes); stopped machines past `keep_for`, unfit for the spec rented now,
  above the pool's size or of a queue without a pool -> terminating, and so is one the provider
  runs though we stopped it; resuming -> ready at its worker's first sign of life (a warm hit),
  -> terminating when dead or without a ready worker by `resume_timeout` (a warm miss: its host
  avoided, no backoff: the next tick rents fresh at once);
- an intent no launch picked up, a drain or a destroy not finished: retried;
- a machine carrying our label that no live row owns (an orphan) is destroyed once it has been
  seen for `ORPHAN_GRACE`.

A provider whose list could not be read decides nothing that depends on its list: missing data
never destroys or closes anything.

A listing is evidence only about what existed before it was taken. The rows are read twice,
before the lists and after; a row that moved in between (`unsettled`: a stop, a create, a
resume committed while a provider was being listed) is judged as if its provider had not been
listed this round: a machine just stopped is not "running though we stopped it", one just
created is not "gone while booting". The next round, whose listing comes after the move,
judges it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime

from autoscaler.config.models import Config
from autoscaler.lifecycle import FINAL_STATES, LIVE_STATES, InstanceState, MachineStatus
from autoscaler.policy import warm
from autoscaler.policy.reconcile_plan import (
    DestroyOrphan,
    NoteSilence,
    OrphanKey,
    ReconcilePlan,
    Retry,
    Transition,
    typed,
)
from autoscaler.policy.reconcile_rules import (
    CREATE_GRACE,
    DEAD_STOP_GRACE,
    INTENT_STALE,
    ORPHAN_GRACE,
    OUTBID,
    SILENCE_CONFIRM,
    STEP_RETRY,
    STOP_TIMEOUT,
    Listed,
    ProviderView,
    Row,
    age,
    judge_row,
    own_machine,
)

__all__ = [
    "CREATE_GRACE",
    "DEAD_STOP_GRACE",
    "INTENT_STALE",
    "ORPHAN_GRACE",
    "OUTBID",
    "SILENCE_CONFIRM",
    "STEP_RETRY",
    "STOP_TIMEOUT",
    "DestroyOrphan",
    "Listed",
    "NoteSilence",
    "ProviderView",
    "ReconcilePlan",
    "Retry",
    "Row",
    "Transition",
    "reconcile",
    "unsettled",
]

S = InstanceState


def reconcile(
    rows: tuple[Row, ...],
    providers: Mapping[str, ProviderView],
    orphans_seen: Mapping[OrphanKey, tuple[str, datetime]],
    config: Config,
    now: datetime,
    unsettled: frozenset[str] = frozenset(),
) -> ReconcilePlan:
    """Every move, retry and orphan destroy that the rows and the providers' lists call for.
    Rows in `unsettled` moved (or were made) while the lists were taken: no list is evidence
    about them this round."""
    if now.tzinfo is None:
        raise ValueError("reconcile() needs an aware datetime for now (UTC)")
    listed: dict[str, dict[str, list[Listed]]] = {}
    for name, view in providers.items():
        if view.listed:
            by_launch: dict[str, list[Listed]] = {}
            for m in view.machines:
                if m.status != MachineStatus.GONE:
                    by_launch.setdefault(m.launch_id, []).append(m)
            listed[name] = by_launch
    transitions: list[Transition] = []
    retries: list[Retry] = []
    silences: list[NoteSilence] = []
    retire = warm.retirements(
        (
            warm.Stopped(r.launch_id, r.queue, r.provider, r.spec_key, r.since)
            for r in rows
            if r.state == S.STOPPED
        ),
        config,
        now,
    )
    for row in rows:
        row_view = providers.get(row.provider)
        known = listed.get(row.provider)
        if row.launch_id in unsettled and row_view is not None:
            row_view, known = replace(row_view, listed=False, machines=()), None
        machine = own_machine(row, known.get(row.launch_id, []) if known is not None else [])
        step = judge_row(row, row_view, known is not None, machine, config, now, retire)
        if isinstance(step, Transition):
            transitions.append(step)
        elif isinstance(step, Retry):
            retries.append(step)
        elif isinstance(step, NoteSilence):
            silences.append(step)
    destroys, orphans = _orphans(rows, providers, orphans_seen, now, unsettled)
    return typed(tuple(transitions), tuple(retries), destroys, orphans, tuple(silences))


def unsettled(
    rows: tuple[Row, ...], before: dict[str, tuple[InstanceState, datetime]]
) -> frozenset[str]:
    """The rows that moved (or were made) between `before` and now: a live row whose state or
    since differs from before, or a closed one that was live before."""
    out = set()
    for r in rows:
        was = before.get(r.launch_id)
        if r.state in LIVE_STATES:
            if was != (r.state, r.since):
                out.add(r.launch_id)
        elif was is not None:
            out.add(r.launch_id)
    return frozenset(out)


def _orphans(
    rows: tuple[Row, ...],
    providers: Mapping[str, ProviderView],
    seen_before: Mapping[OrphanKey, tuple[str, datetime]],
    now: datetime,
    unsettled: frozenset[str] = frozenset(),
) -> tuple[tuple[DestroyOrphan, ...], dict[OrphanKey, tuple[str, datetime]]]:
    owners = {r.launch_id: r for r in rows}
    destroys: list[DestroyOrphan] = []
    orphans: dict[OrphanKey, tuple[str, datetime]] = {}
    for name, view in providers.items():
        if not view.listed:
            # Unknown now: keep what was known so the grace time is not restarted.
            orphans.update({k: v for k, v in seen_before.items() if k[0] == name})
            continue
        for m in view.machines:
            if m.status == MachineStatus.GONE:
                continue
            key = (name, m.provider_instance_id)
            if m.launch_id in unsettled:  # its row moved while listed: judged next round
                if key in seen_before:
                    orphans[key] = seen_before[key]
                continue
            owner = owners.get(m.launch_id)
            why = _orphan_reason(owner, name, m)
            if why is None:
                continue
            first = seen_before.get(key, (m.label, now))[1]
            orphans[key] = (m.label, first)
            seen_for = age(first, now)
            if seen_for >= ORPHAN_GRACE:
                destroys.append(
                    DestroyOrphan(
                        name, m.provider_instance_id, m.label, f"{why}; seen for {seen_for:.0f}s"
                    )
                )
    return tuple(destroys), orphans


def _orphan_reason(owner: Row | None, provider: str, m: Listed) -> str | None:
    if owner is None:
        return "carries our label but no row owns it"
    if owner.provider != provider:
        return f"its row belongs to provider {owner.provider!r}"
    if owner.state in FINAL_STATES:
        return f"its row is {owner.state.value}"
    if owner.provider_instance_id not in (None, m.provider_instance_id):
        return (
            f"a second machine for launch {owner.launch_id} "
            f"(the row owns {owner.provider_instance_id})"
        )
    return None

"""Account-wide spend caps: a limit on machines and on $/hour shared by every queue.

When the queues together want more than the caps allow, launches are granted by
`autoscale.priority` (higher first); queues of equal priority take turns one machine at a time
(in name order), so one busy queue cannot starve an equal one. Every machine that may be
billing counts (booting and draining too); a machine without a known price counts at its
queue's `instance.max_price_per_hour`, the most it can cost (the dearest configured cap for a
queue no longer in the config); a warm pool's stopped machine counts its storage price only,
and no machine (what each state counts: `policy.billing.committed`, the one money rule). Caps
never drain anything: over a cap (e.g. after lowering it) the queues simply get no new machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoscaler.config.models import Config, Limits
from autoscaler.policy.billing import Charge, committed
from autoscaler.policy.plan import Plan
from autoscaler.policy.snapshot import Snapshot

_EPS = 1e-9


@dataclass(frozen=True)
class Request:
    queue: str
    priority: int
    machines: int
    price_per_hour: float


@dataclass(frozen=True)
class LaunchGrant:
    queue: str
    granted: int
    waiting: int
    reason: str | None


def usage(snapshot: Snapshot, config: Config) -> tuple[int, float]:
    """(machines, $/hour) of every billing machine of the account, across all queues: those
    the snapshot lists and those it only counts (`Snapshot.elsewhere`, other shards')."""
    machines = 0
    dollars = 0.0
    # A machine of a queue no longer configured, with no known price, may cost as much as the
    # dearest machine any queue may rent: counting it at $0 would let spend pass the cap.
    dearest = max(
        (q.autoscale.instance.max_price_per_hour for q in config.queues.values() if q.autoscale),
        default=0.0,
    )

    def fallback(queue: str) -> float:
        queue_cfg = config.queues.get(queue)
        auto = queue_cfg.autoscale if queue_cfg is not None else None
        return auto.instance.max_price_per_hour if auto is not None else dearest

    for q in snapshot.queues:
        price = fallback(q.name)
        for m in q.machines:
            counts = committed(m.state)
            if counts is Charge.STORAGE:  # a warm pool's: no machine running, its disk
                dollars += m.storage_price_per_hour or 0.0
            elif counts is Charge.FULL:
                machines += 1
                dollars += m.price_per_hour if m.price_per_hour is not None else price
    for b in snapshot.elsewhere:
        counts = committed(b.state)
        if counts is Charge.STORAGE:
            dollars += b.known_dollars
        elif counts is Charge.FULL:
            machines += b.machines
            dollars += b.known_dollars + b.unpriced * fallback(b.queue)
    return machines, dollars


def allocate(
    requests: list[Request], limits: Limits, used_machines: int, used_dollars: float
) -> dict[str, LaunchGrant]:
    """Grant launches under the caps, by priority, round-robin within a priority."""
    want = {r.queue: r.machines for r in requests}
    granted = dict.fromkeys(want, 0)
    blocked: dict[str, str] = {}
    machines, dollars = used_machines, used_dollars
    by_priority = sorted({r.priority for r in requests}, reverse=True)
    for prio in by_priority:
        group = sorted((r for r in requests if r.priority == prio), key=lambda r: r.queue)
        progress = True
        while progress:
            progress = False
            for r in group:
                if granted[r.queue] >= want[r.queue] or r.queue in blocked:
                    continue
                if limits.max_machines is not None and machines + 1 > limits.max_machines:
                    blocked[r.queue] = (
                        f"limits.max_machines = {limits.max_machines} reached "
                        f"({machines} machines billing account-wide)"
                    )
                    continue
                if (
                    limits.max_price_per_hour is not None
                    and dollars + r.price_per_hour > limits.max_price_per_hour + _EPS
                ):
                    blocked[r.queue] = (
                        f"limits.max_price_per_hour = ${limits.max_price_per_hour:.2f}/h would be "
                        f"exceeded (${dollars:.2f}/h billing + ${r.price_per_hour:.2f}/h for one "
                        "more machine)"
                    )
                    continue
                granted[r.queue] += 1
                machines += 1
                dollars += r.price_per_hour
                progress = True

    out: dict[str, LaunchGrant] = {}
    for r in requests:
        waiting = want[r.queue] - granted[r.queue]
        reason = None
        if waiting > 0:
            served = [
                f"{o.queue} (priority {o.priority}) +{granted[o.queue]}"
                for o in requests
                if o.queue != r.queue and granted[o.queue] > 0 and o.priority >= r.priority
            ]
            ahead = f"; served first: {', '.join(served)}" if served else ""
            reason = (
                f"spend cap: {blocked.get(r.queue, 'cap reached')}; "
                f"{waiting} of {want[r.queue]} machine(s) wait (priority {r.priority}){ahead}"
            )
        out[r.queue] = LaunchGrant(r.queue, granted[r.queue], waiting, reason)
    return out


def still_granted(plan: Plan, snapshot: Snapshot, config: Config) -> bool:
    """Whether decide() on `snapshot` grants `plan`'s launches and resumes as they are: the
    plan waited on no cap, and all of them together still fit under the caps with the
    account's usage as `snapshot` counts it (`allocate` grants every request when their total
    fits, whatever the order). A sharded tick whose recount moved checks this before deciding
    again: another shard's launches change its plan only when they make a cap bind."""
    limits = config.limits
    if limits.max_machines is None and limits.max_price_per_hour is None:
        return True
    if any(w.kind == "spend_cap" for qp in plan.queues for w in qp.waits):
        return False
    machines, dollars = usage(snapshot, config)
    for qp in plan.queues:
        n = len(qp.launches) + len(qp.resumes)
        if n:
            auto = config.queues[qp.queue].autoscale
            machines += n
            dollars += n * (auto.instance.max_price_per_hour if auto is not None else 0.0)
    if limits.max_machines is not None and machines > limits.max_machines:
        return False
    return limits.max_price_per_hour is None or dollars <= limits.max_price_per_hour + _EPS

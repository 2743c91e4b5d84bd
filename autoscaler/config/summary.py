"""The dry run `autoscaler validate` prints: what would scale each queue, when, within what."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from autoscaler.config.durations import format_duration
from autoscaler.config.isolation import WATCH_BROKER_ENV
from autoscaler.config.machine_specs import InstanceSpec
from autoscaler.config.metrics_sources import MetricsSource
from autoscaler.config.models import Autoscale, Config
from autoscaler.config.provider_options import HOURS_PER_MONTH, ProviderConfig, money
from autoscaler.settings import redact_url


def _metrics_where(m: MetricsSource) -> str:
    if m.url:
        return f"on {redact_url(m.url)}"
    return f"on the broker in ${m.url_env or WATCH_BROKER_ENV}"


def known_price(provider: ProviderConfig, spec: InstanceSpec) -> tuple[float, str] | None:
    """What every machine of `spec` costs on `provider` when that is known before renting (mock
    and local providers charge a fixed price; RunPod and Vast.ai are live markets), and how."""
    return provider.known_price(spec)


def _never_rents(
    name: str, provider: ProviderConfig, spec: InstanceSpec, alone: bool = True
) -> str | None:
    known = known_price(provider, spec)
    if known is None or known[0] <= spec.max_price_per_hour:
        return None
    price, how = known
    never = "this queue can never rent a machine" if alone else f"{name} is never rented from"
    return (
        f"  warning: {name} charges {money(price)}/h for this machine ({how}), above the cap of "
        f"{money(spec.max_price_per_hour)}/h, so {never}; raise "
        f"instance.max_price_per_hour to at least {money(price)} or lower {name}'s price_per_hour"
    )


def _providers(name: str, auto: Autoscale, providers: Mapping[str, ProviderConfig]) -> list[str]:
    """Where the queue rents: its provider's terms, or for a list the placement rule and each
    provider's terms (the warnings of a provider that can never rent under the cap)."""
    spec = auto.instance
    if isinstance(auto.provider, str):
        provider = providers[auto.provider]
        return [
            f"queue {name}: on {auto.provider} ({provider.terms()})",
            *filter(None, [_never_rents(auto.provider, provider, spec)]),
        ]
    never = [_never_rents(p, providers[p], spec) for p in auto.providers]
    alone = all(never)
    return [
        f"queue {name}: on {', '.join(auto.providers)}, placement {auto.placement} (offers "
        f"asked of all at once, {format_duration(auto.offer_timeout)} each at most; a provider "
        "that fails or waits is passed over for the next)",
        *[f"  {p}: {providers[p].terms()}" for p in auto.providers],
        *filter(None, [_never_rents(p, providers[p], spec, alone) for p in auto.providers]),
    ]


def _pool_cost(providers: Sequence[ProviderConfig], auto: Autoscale) -> float | None:
    """The pool's price while full on the dearest of its providers; None when one prices per
    host."""
    costs = [warm_pool_cost(p, auto) for p in providers]
    return None if any(c is None for c in costs) else max(c for c in costs if c is not None)


def _rate(x: float) -> str:
    """A small price per hour readably: $0.02, $0.011, $0.00548 (three significant digits)."""
    return money(x) if round(x, 2) == x else f"${x:.3g}"


def warm_pool_cost(provider: ProviderConfig, auto: Autoscale) -> float | None:
    """What the queue's warm pool bills per hour while full (its stopped machines' disks);
    None where each host sets its own storage price (a live market)."""
    known = provider.known_storage_price(auto.instance)
    return None if known is None else auto.warm_pool.size * known[0]


def _warm_pool(provider: ProviderConfig, auto: Autoscale) -> list[str]:
    """The pool's bounds and its price while full: the dry run is where its cost is seen before
    it is paid."""
    pool = auto.warm_pool
    if pool.size == 0:
        return []
    known = provider.known_storage_price(auto.instance)
    if known is None:
        cost = (
            f"{pool.size} × its host's own storage price per GB-month × the instance's "
            f"{auto.instance.disk_gb} GB disk, priced per host at rent time (not known before)"
        )
    elif known[0] == 0:
        cost = f"no storage cost ({known[1]})"
    else:
        total = pool.size * known[0]
        cost = (
            f"{pool.size} × {_rate(known[0])}/h ({known[1]}) = {_rate(total)}/h of storage "
            f"(≈ ${total * HOURS_PER_MONTH:.2f}/month)"
        )
    return [
        f"  warm pool: up to {pool.size} stopped machine(s) kept, each destroyed after "
        f"{format_duration(pool.keep_for)} stopped; a resumed one with no ready worker within "
        f"{format_duration(pool.resume_timeout)} is destroyed and a fresh one rented",
        f"    while full: {cost}; a stopped machine is not capacity and does not count toward "
        "max_workers",
    ]


def _interruptible(auto: Autoscale) -> list[str]:
    spec = auto.instance.interruptible
    if spec is None:
        return []
    bid = spec.bid if isinstance(spec.bid, str) else f"${spec.bid:g}/h"
    if isinstance(spec.bid, str):
        bid += " of each offer's on-demand price"
    return [
        f"  interruptible: up to {spec.max_share:.0%} of its machines rented at a bid of {bid} "
        "(Vast); an outbid machine is destroyed, its jobs handed back and a replacement rented, "
        "on demand once the share is used"
    ]


def _early_acks(auto: Autoscale) -> list[str]:
    """Machines that can stop under a running job (outbid) or that a pool stops and starts:
    with Celery's default early acks, the job a lost machine ran is gone with it."""
    why = [
        *(["interruptible machines"] if auto.instance.interruptible is not None else []),
        *(["a warm pool"] if auto.warm_pool.size else []),
    ]
    if not why:
        return []
    return [
        f"  warning: with {' and '.join(why)}, a machine can be lost while its worker holds jobs: "
        "with Celery's default early acks a running job is then gone; set "
        "task_acks_late=True and task_reject_on_worker_lost=True in the workers' Celery app "
        "so its jobs come back and run again (at once on RabbitMQ; on Redis after kombu's "
        "visibility_timeout, an hour by default)"
    ]


def _origins(config: Config, registered: Mapping[str, ProviderConfig] | None) -> list[str]:
    """Where each provider comes from; the file's declaration wins over a registered one."""
    autos = [q.autoscale for q in config.queues.values() if q.autoscale is not None]
    used = {p for auto in autos for p in auto.providers}
    lines = []
    for name in sorted(set(config.providers) | used):
        if name in config.providers:
            origin = "declared in this file"
            if registered is not None and name in registered:
                origin += " (overrides the registered one of the same name)"
            if name not in used:
                origin += " (no queue uses it)"
        elif registered is not None and name in registered:
            origin = "registered in the state store"
        else:
            continue
        lines.append(f"provider {name}: {origin}")
    return lines


def describe(
    config: Config,
    providers: Mapping[str, ProviderConfig],
    now: datetime,
    registered: Mapping[str, ProviderConfig] | None = None,
) -> str:
    """The dry run. `providers`: every provider a queue may name (the file's over the store's);
    `registered`: the store's own, to say which one is used when both have a name (None: the
    store could not be read)."""
    lines = [
        f"poll every {format_duration(config.poll_interval)}, boot timeout "
        f"{format_duration(config.boot_timeout)}, silent worker deadline "
        f"{format_duration(config.heartbeat_timeout)}, failed rentals back off "
        f"{format_duration(config.backoff.base)} doubling up to "
        f"{format_duration(config.backoff.cap)}",
    ]
    caps = []
    if config.limits.max_machines is not None:
        caps.append(f"{config.limits.max_machines} machines")
    if config.limits.max_price_per_hour is not None:
        caps.append(f"${config.limits.max_price_per_hour:.2f}/h")
    if caps:
        lines.append(
            "account-wide spend cap: "
            + " and ".join(caps)
            + " (queues served by priority, highest first)"
        )
    if config.evaluation.shards > 1:
        lines.append(
            f"evaluation in {config.evaluation.shards} shards: a tick per shard, run by as many "
            "worker processes at once (PostgreSQL; the embedded SQLite store runs one)"
        )
    origins = _origins(config, registered)
    if origins:
        lines += ["", *origins]
    if not config.queues:
        lines += ["", "no queue is configured: nothing is ever rented"]
    total = 0.0
    pools, pools_known, pools_per_host = 0.0, False, 0
    for name, queue in config.queues.items():
        auto = queue.autoscale
        lines.append("")
        if auto is None or not auto.enabled:
            lines.append(f"queue {name}: autoscaling off")
            continue
        provider = providers[auto.providers[0]]
        spec = auto.instance
        worst = auto.max_workers * spec.max_price_per_hour
        total += worst
        head, *warnings = _providers(name, auto, providers)
        lines += [
            head,
            *[w for w in warnings if not w.startswith("  warning")],
            f"  machine: {' or '.join(spec.gpus)} ×{spec.gpu_count}, {spec.disk_gb} GB disk, "
            f"at most ${spec.max_price_per_hour:.2f}/h each; image {spec.image}",
            f"  bounds: {auto.min_workers}..{auto.max_workers} machines (booting ones count), "
            f"priority {auto.priority}; worst case ${worst:.2f}/h",
            *[w for w in warnings if w.startswith("  warning")],
            *(
                [
                    "  max_workers: 0: watched and counted, never rented (its hand-made "
                    "workers are its capacity; raise max_workers to rent)"
                ]
                if auto.max_workers == 0
                else []
            ),
            *_warm_pool(provider, auto),
            *_interruptible(auto),
            *_early_acks(auto),
            f"  metrics: {queue.metrics.source} queue {queue.metrics.queue or name} "
            f"{_metrics_where(queue.metrics)}",
        ]
        if auto.warm_pool.size:
            cost = _pool_cost([providers[p] for p in auto.providers], auto)
            if cost is None:
                pools_per_host += auto.warm_pool.size
            else:
                pools += cost
                pools_known = True
        if auto.scale_up:
            lines += ["  scale up when:"] + [f"    - {t.describe(now)}" for t in auto.scale_up]
        else:
            lines.append("  scale up: no trigger (only min_workers is kept)")
        if auto.scale_down:
            lines += ["  scale down when:"]
            lines += [f"    - {t.describe(now, auto.warm_pool)}" for t in auto.scale_down]
        else:
            lines.append("  scale down: no trigger (machines are kept until changed by hand)")
    capped = config.limits.max_price_per_hour
    all_queues = f"worst case for all queues: ${total:.2f}/h"
    if capped is not None and capped < total:
        all_queues += f", held to ${capped:.2f}/h by limits.max_price_per_hour"
    lines += ["", all_queues]
    if pools_known or pools_per_host:
        parts = [f"{_rate(pools)}/h of storage"] if pools_known else []
        if pools_per_host:
            parts.append(f"the storage of {pools_per_host} stopped machine(s) priced per host")
        lines.append(
            "warm pools while full: " + ", plus ".join(parts) + ", on top of the worst case"
        )
    return "\n".join(lines)

"""The dry run `autoscaler validate` prints: what would scale each queue, when, within what."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from zoneinfo import ZoneInfo

from croniter import croniter

from autoscaler.config.durations import format_duration
from autoscaler.config.isolation import WATCH_BROKER_ENV
from autoscaler.config.models import (
    Config,
    IdleTrigger,
    LatencyTrigger,
    MetricsSource,
    MetricTrigger,
    NoWorkersTrigger,
    ProviderConfig,
    QueueDepthTrigger,
    RunPodProvider,
    ScheduleDownTrigger,
    ScheduleUpTrigger,
    VastProvider,
)
from autoscaler.settings import redact_url


def _next_firing(cron: str, tz: str, now: datetime) -> str:
    local_now = now.astimezone(ZoneInfo(tz))
    nxt = croniter(cron, local_now).get_next(datetime)
    return f"{nxt:%Y-%m-%d %H:%M} {tz}"


def _scale_up(t: object, now: datetime) -> str:
    if isinstance(t, NoWorkersTrigger):
        return "jobs pending and no live worker serves the queue → start 1 machine"
    if isinstance(t, QueueDepthTrigger):
        if t.target_per_worker is not None:
            return f"queue depth → ceil(pending / {t.target_per_worker}) machines"
        return f"more than {t.threshold} jobs pending → add 1 machine"
    if isinstance(t, LatencyTrigger):
        return f"oldest pending job older than {format_duration(t.max_latency)} → add 1 machine"
    if isinstance(t, MetricTrigger):
        rule = (
            f"above {t.threshold:g} → add 1 machine"
            if t.threshold is not None
            else f"→ ceil(value / {t.target_per_worker:g}) machines"
        )
        return f"Prometheus {t.query!r} {rule}"
    if isinstance(t, ScheduleUpTrigger):
        return (
            f"schedule {t.cron!r} ({t.timezone}) → keep at least {t.workers} machine(s) for "
            f"{format_duration(t.duration)}; next {_next_firing(t.cron, t.timezone, now)}"
        )
    raise TypeError(t)


def _scale_down(t: object, now: datetime) -> str:
    if isinstance(t, IdleTrigger):
        return (
            f"a worker has run no task for {format_duration(t.timeout)} → drain it and "
            "destroy its machine (most idle first, busy workers spared, never below the floor)"
        )
    if isinstance(t, ScheduleDownTrigger):
        return (
            f"schedule {t.cron!r} ({t.timezone}) → back to min_workers (idle drained now, busy "
            f"once they finish); next {_next_firing(t.cron, t.timezone, now)}"
        )
    raise TypeError(t)


def _metrics_where(m: MetricsSource) -> str:
    if m.url:
        return f"on {redact_url(m.url)}"
    return f"on the broker in ${m.url_env or WATCH_BROKER_ENV}"


def _provider_terms(p: ProviderConfig) -> str:
    if isinstance(p, RunPodProvider):
        gpus = ", ".join(p.gpu_types) or "the queue's GPU"
        return f"RunPod {p.cloud_type} cloud, GPU types in order: {gpus}"
    if isinstance(p, VastProvider):
        terms = ["verified" if p.verified else "any host"]
        if p.countries:
            terms.append("in " + "/".join(p.countries))
        if p.min_bandwidth_mbps is not None:
            terms.append(f"≥{p.min_bandwidth_mbps:g} Mb/s down")
        if p.min_cuda_version is not None:
            terms.append(f"CUDA ≥{p.min_cuda_version:g}")
        if p.min_reliability is not None:
            terms.append(f"reliability ≥{p.min_reliability:g}")
        return "Vast.ai cheapest offer, " + ", ".join(terms)
    if p.kind == "mock":
        return "mock machines (nothing is rented)"
    return "local processes on this machine (nothing is rented)"


def describe(config: Config, providers: Mapping[str, ProviderConfig], now: datetime) -> str:
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
    total = 0.0
    for name, queue in config.queues.items():
        auto = queue.autoscale
        lines.append("")
        if auto is None or not auto.enabled:
            lines.append(f"queue {name}: autoscaling off")
            continue
        provider = providers[auto.provider]
        spec = auto.instance
        worst = auto.max_workers * spec.max_price_per_hour
        total += worst
        lines += [
            f"queue {name}: on {auto.provider} ({_provider_terms(provider)})",
            f"  machine: {spec.gpu} ×{spec.gpu_count}, {spec.disk_gb} GB disk, at most "
            f"${spec.max_price_per_hour:.2f}/h each; image {spec.image}",
            f"  bounds: {auto.min_workers}..{auto.max_workers} machines (booting ones count), "
            f"priority {auto.priority}; worst case ${worst:.2f}/h",
            f"  metrics: {queue.metrics.source} queue {queue.metrics.queue or name} "
            f"{_metrics_where(queue.metrics)}",
        ]
        lines += ["  scale up when:"] + [f"    - {_scale_up(t, now)}" for t in auto.scale_up]
        if not auto.scale_up:
            lines.append("  scale up: no trigger (only min_workers is kept)")
        lines += ["  scale down when:"] + [f"    - {_scale_down(t, now)}" for t in auto.scale_down]
        if not auto.scale_down:
            lines.append("  scale down: no trigger (machines are kept until changed by hand)")
    capped = config.limits.max_price_per_hour
    all_queues = f"worst case for all queues: ${total:.2f}/h"
    if capped is not None and capped < total:
        all_queues += f", held to ${capped:.2f}/h by limits.max_price_per_hour"
    lines += ["", all_queues]
    return "\n".join(lines)

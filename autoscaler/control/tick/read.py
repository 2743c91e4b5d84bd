"""The tick's one read of every source: each queue's metrics, broker-seen and agent workers
merged in, Prometheus triggers read beside them."""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import replace

from autoscaler.brokers.base import MetricsConfigError
from autoscaler.brokers.prometheus import PrometheusReader, PromSample, with_external
from autoscaler.config.triggers import MetricTrigger
from autoscaler.control.runtime import Loaded, Runtime, utc_now
from autoscaler.policy.snapshot import QueueMetrics

log = logging.getLogger("autoscaler.control.tick")


def read_metrics(rt: Runtime, loaded: Loaded, queues: Collection[str]) -> dict[str, QueueMetrics]:
    """Every source read once for the queues it serves; Prometheus values joined in."""
    if not queues:
        return {}
    subset = {q: loaded.config.queues[q] for q in queues}
    out: dict[str, QueueMetrics] = {}
    for group in rt.read_groups(subset):
        try:
            source = rt.source(group)
        except MetricsConfigError as exc:
            for names in group.queues.values():
                for name in names:
                    out[name] = QueueMetrics(
                        name, 0, None, 0, utc_now(), stale=True, error=str(exc)
                    )
            continue
        readings = source.read(list(group.queues))
        for broker_queue, names in group.queues.items():
            for name in names:
                out[name] = replace(readings[broker_queue], queue=name)
    for name in queues:
        auto = loaded.config.queues[name].autoscale
        triggers = [t for t in (auto.scale_up if auto else ()) if isinstance(t, MetricTrigger)]
        if triggers and name in out:
            found: list[PromSample] = []
            for trig in triggers:
                reader = _prometheus(rt, trig)
                if reader is not None:
                    found.extend(reader.read([trig.query]).values())
            out[name] = with_external(out[name], found)
    return out


def _prometheus(rt: Runtime, trig: MetricTrigger) -> PrometheusReader | None:
    """The trigger's Prometheus reader (the runtime's, per config version); None, logged, where
    its address is not set."""
    try:
        return rt.prometheus(trig)
    except MetricsConfigError as exc:
        log.warning("%s", exc)
        return None

"""Warm pools, pure: which drains end stopped instead of destroyed, which stopped machines a
launch resumes, and which stopped machines must go (`autoscale.warm_pool`).

A pool's machine was drained (never stopped with work on it), then stopped at its provider with
its disk kept. It is not capacity and not counted by `max_workers`; it bills its storage price.
A launch resumes the most recently stopped machine rented as the spec a launch would rent now
(`spec_key`): a config change of provider, GPU, image or disk makes older ones unfit, and
reconcile destroys them (`retirements`), as it does those past `keep_for` and those above `size`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from autoscaler.config.models import Autoscale, Config
from autoscaler.lifecycle import InstanceState
from autoscaler.policy.plan import Drain
from autoscaler.policy.snapshot import Machine

S = InstanceState


def spec_key(auto: Autoscale) -> str:
    """What a machine of the queue is rented as: its providers and what the machine is (GPUs,
    count, disk, image), as written (one name, or a list: a list changed makes older machines
    unfit). Prices, triggers, placement and the deployment do not make a machine unfit: the
    agent fetches the code again on every resume."""
    spec = auto.instance
    body = [auto.provider, spec.gpu, spec.gpu_count, spec.disk_gb, spec.image]
    return hashlib.sha256(json.dumps(body).encode()).hexdigest()[:32]


def pool_size(auto: Autoscale | None) -> int:
    """Stopped machines the queue may keep (0 when it is not autoscaled). `validate` refuses a
    pool on a provider kind that cannot stop; a stop refused anyway destroys the machine."""
    if auto is None or not auto.enabled:
        return 0
    return auto.warm_pool.size


def _fits(m: Machine, auto: Autoscale, key: str) -> bool:
    return m.provider in auto.providers and m.spec_key == key


def resumable(machines: Iterable[Machine], auto: Autoscale, config: Config) -> list[Machine]:
    """Stopped machines a launch may resume, the most recently stopped first (its disk is the
    freshest, its host the likeliest to still have its GPU)."""
    if pool_size(auto) == 0:
        return []
    key = spec_key(auto)
    fit = [m for m in machines if m.state == S.STOPPED and _fits(m, auto, key)]
    return sorted(fit, key=lambda m: (m.stopped_at or m.created_at, m.launch_id), reverse=True)


def _held(machines: Iterable[Machine], key: str, auto: Autoscale) -> int:
    """Places of the pool already taken: machines in it, and machines whose drain will end in it
    (granted earlier, not yet stopped)."""
    return sum(
        1
        for m in machines
        if _fits(m, auto, key)
        and (m.warm or (m.keep_warm and m.state in (S.READY, S.DRAINING, S.DRAINED)))
    )


def keep_warm(
    drains: list[Drain], machines: tuple[Machine, ...], auto: Autoscale, config: Config
) -> list[Drain]:
    """The scale-down's drains, those the pool has room for marked `keep_warm` (the most idle
    first, as the drains come). Decided here, under the evaluation's lease, so two drains ending
    at once cannot both take the pool's last place."""
    size = pool_size(auto)
    if size == 0 or not drains:
        return drains
    key = spec_key(auto)
    by_id = {m.launch_id: m for m in machines}
    room = size - _held(machines, key, auto)
    out = []
    for d in drains:
        m = by_id.get(d.launch_id)
        fits = m is not None and _fits(m, auto, key) and not m.keep_warm
        if room > 0 and fits and d.trigger != "drain_requested":
            out.append(_warm(d))
            room -= 1
        else:
            out.append(d)
    return out


def _warm(d: Drain) -> Drain:
    return Drain(
        queue=d.queue,
        launch_id=d.launch_id,
        trigger=d.trigger,
        reason=f"{d.reason}; then stopped for the warm pool",
        when_idle=d.when_idle,
        keep_warm=True,
    )


@dataclass(frozen=True)
class Stopped:
    """A stopped machine as reconcile sees it (from its row)."""

    launch_id: str
    queue: str
    provider: str
    spec_key: str | None
    since: datetime
    """When it was stopped."""


def retirements(stopped: Iterable[Stopped], config: Config, now: datetime) -> dict[str, str]:
    """Stopped machines to destroy, launch id -> why: past `keep_for`, unfit for the spec rented
    now, of a queue no longer configured or whose pool is gone, and those above `size` (the
    oldest first)."""
    out: dict[str, str] = {}
    by_queue: dict[str, list[Stopped]] = {}
    for m in stopped:
        by_queue.setdefault(m.queue, []).append(m)
    for queue, ms in sorted(by_queue.items()):
        queue_cfg = config.queues.get(queue)
        auto = queue_cfg.autoscale if queue_cfg is not None else None
        size = pool_size(auto)
        if auto is None or size == 0:
            why = "the queue is no longer configured" if auto is None else "the queue keeps no pool"
            out.update({m.launch_id: f"warm pool: {why}" for m in ms})
            continue
        key = spec_key(auto)
        keep: list[Stopped] = []
        for m in ms:
            age = (now - m.since).total_seconds()
            if age >= auto.warm_pool.keep_for:
                out[m.launch_id] = (
                    f"warm pool: stopped for {age:.0f}s ≥ keep_for {auto.warm_pool.keep_for:.0f}s"
                )
            elif m.provider not in auto.providers or m.spec_key != key:
                out[m.launch_id] = (
                    "warm pool: rented as another spec than the queue rents now (provider, GPU, "
                    "image or disk changed): never resumed"
                )
            else:
                keep.append(m)
        keep.sort(key=lambda m: (m.since, m.launch_id), reverse=True)
        out.update({m.launch_id: f"warm pool: above its size {size}" for m in keep[size:]})
    return out

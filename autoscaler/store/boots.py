"""Boot statistics: seconds from the decision (an intent row's `created_at`) to ready
(`ready_at`) of cold boots, both on the store's clock. Control-plane times only: what a machine
reports of its boot (`store.boot_phases`) never enters here. The loop's boot estimates, the
placement's boot times, `status`' medians, and the earlier boots a new one is judged against
(`control.machines`: the judgment itself is `policy.boots`')."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from autoscaler.config import gpus
from autoscaler.policy.boots import BootStat, boot_stat
from autoscaler.policy.triggers import DEFAULT_BOOT_ESTIMATE
from autoscaler.store.models import Instance

BOOT_HISTORY = 5
"""The boot time of a queue is the longest of its last this many boots (ready in time)."""

BOOT_STATS_WINDOW = timedelta(days=7)
"""Boot statistics (`boot_stats`, the slow-host rule) count cold boots ready this recently."""

BOOT_STATS_SAMPLES = 50
"""… and at most this many of the newest per key."""

_BOOT_KEYS = {"queue": Instance.queue, "provider": Instance.provider, "gpu": Instance.gpu}


class ColdBoot(NamedTuple):
    """One cold boot: seconds from the decision (the intent row's `created_at`) to ready
    (`ready_at`), both on the store's clock, and its rank among the newest of each key."""

    launch_id: str
    queue: str
    provider: str
    gpu: str | None
    host_id: str | None
    seconds: float
    ranks: tuple[int, ...]


def cold_boots(
    session: Session,
    since: datetime,
    *,
    per: Sequence[Sequence[str]],
    latest: int,
    where: Sequence[Any] = (),
) -> list[ColdBoot]:
    """Cold boots (`resumes == 0`: a resumed machine is ready hours after its intent) ready
    since `since`, newest first: those among the `latest` newest of their key for any key of
    `per` (column names of `queue`, `provider`, `gpu`), `where` further SQL conditions. One
    query (a window function per key, on PostgreSQL and SQLite alike). Control-plane times
    only: what a machine reports never enters here."""
    ranks = [
        func.row_number()
        .over(
            partition_by=[_BOOT_KEYS[c] for c in key],
            order_by=(Instance.ready_at.desc(), Instance.id.desc()),
        )
        .label(f"rank{i}")
        for i, key in enumerate(per)
    ]
    found = (
        select(
            Instance.launch_id,
            Instance.queue,
            Instance.provider,
            Instance.gpu,
            Instance.host_id,
            Instance.created_at,
            Instance.ready_at,
            *ranks,
        )
        .where(
            Instance.ready_at.is_not(None),
            Instance.ready_at >= since,
            Instance.ready_at >= Instance.created_at,
            Instance.resumes == 0,
            *where,
        )
        .subquery()
    )
    kept = or_(*(found.c[f"rank{i}"] <= latest for i in range(len(per))))
    out = []
    for r in session.execute(select(found).where(kept).order_by(found.c.ready_at.desc())):
        out.append(
            ColdBoot(
                r.launch_id,
                r.queue,
                r.provider,
                r.gpu,
                r.host_id,
                max(0.0, (r.ready_at - r.created_at).total_seconds()),
                tuple(int(getattr(r, f"rank{i}")) for i in range(len(per))),
            )
        )
    return out


def boot_estimates(session: Session, queues: list[str], now: datetime) -> dict[str, float]:
    """Seconds from decision (the intent row) to ready of each queue's machines, for the
    (provider, GPU) it rents from now — its newest cold boot's: with placement across providers
    a queue may move to a provider whose machines boot in a third of the time — the longest of
    its last BOOT_HISTORY cold boots there, else over all its boots (the last 30 days). One
    query; cold boots only (a machine resumed from a warm pool was ready long after its
    intent, which would read as a boot of hours and stop the burst rule renting)."""
    if not queues:
        return {}
    everywhere: dict[str, list[float]] = {}
    per_pair: dict[tuple[str, str, str | None], list[float]] = {}
    newest: dict[str, tuple[str, str | None]] = {}
    for b in cold_boots(  # newest first
        session,
        now - timedelta(days=30),
        per=[("queue",), ("queue", "provider", "gpu")],
        latest=BOOT_HISTORY,
        where=[Instance.queue.in_(queues)],
    ):
        newest.setdefault(b.queue, (b.provider, b.gpu))
        if b.ranks[0] <= BOOT_HISTORY:
            everywhere.setdefault(b.queue, []).append(b.seconds)
        if b.ranks[1] <= BOOT_HISTORY:
            per_pair.setdefault((b.queue, b.provider, b.gpu), []).append(b.seconds)
    out = {}
    for queue, seconds in everywhere.items():
        here = per_pair.get((queue, *newest[queue]))
        out[queue] = max(here or seconds)
    return out


def _stats(
    boots: Iterable[ColdBoot], i: int, key: Callable[[ColdBoot], Any]
) -> dict[Any, BootStat]:
    seconds: dict[Any, list[float]] = defaultdict(list)
    for b in boots:
        if b.ranks[i] <= BOOT_STATS_SAMPLES:
            seconds[key(b)].append(b.seconds)
    return {k: stat for k, v in seconds.items() if (stat := boot_stat(v)) is not None}


def boot_tables(
    session: Session, now: datetime
) -> tuple[dict[tuple[str, str], BootStat], dict[tuple[str, str, str], BootStat]]:
    """`boot_stats` and `boot_stats_by_queue` from one query."""
    boots = cold_boots(
        session,
        now - BOOT_STATS_WINDOW,
        per=[("provider", "gpu"), ("queue", "provider", "gpu")],
        latest=BOOT_STATS_SAMPLES,
    )
    return (
        _stats(boots, 0, lambda b: (b.provider, b.gpu or "")),
        _stats(boots, 1, lambda b: (b.queue, b.provider, b.gpu or "")),
    )


def boot_stats(session: Session, now: datetime) -> dict[tuple[str, str], BootStat]:
    """Per (provider, GPU) — "" for a machine whose GPU is unknown — the median and p90
    seconds from decision to ready of its cold boots of the last BOOT_STATS_WINDOW (at most
    the newest BOOT_STATS_SAMPLES), and how many. Control-plane times only. One query."""
    return boot_tables(session, now)[0]


def boot_stats_by_queue(session: Session, now: datetime) -> dict[tuple[str, str, str], BootStat]:
    """`boot_stats` per (queue, provider, GPU). One query."""
    return boot_tables(session, now)[1]


def placement_boot_times(
    session: Session, queue: str, now: datetime
) -> tuple[dict[tuple[str, str], float], float]:
    """What a launch of `queue` ranks offers by (`policy.placement`): the median cold boot per
    (provider, GPU by its table name) — the queue's own boots where it has some, else every
    queue's — and the fallback for a pair never booted (the queue's boot estimate, else the
    default). Control-plane times only."""
    overall, by_queue = boot_tables(session, now)
    times = {(p, gpus.canonical(g)): b.median for (p, g), b in overall.items()}
    times.update(
        {(p, gpus.canonical(g)): b.median for (q, p, g), b in by_queue.items() if q == queue}
    )
    estimate = boot_estimates(session, [queue], now).get(queue)
    return times, estimate if estimate is not None else DEFAULT_BOOT_ESTIMATE


class BootOf(NamedTuple):
    """What judging one machine's boot needs of its row."""

    provider: str
    gpu: str | None
    host_id: str | None
    created_at: datetime
    resumes: int


def boot_of(session: Session, launch_id: str) -> BootOf | None:
    """The provider, GPU, host, intent time and resumes of one machine's row (one query)."""
    row = session.execute(
        select(
            Instance.provider, Instance.gpu, Instance.host_id, Instance.created_at, Instance.resumes
        ).where(Instance.launch_id == launch_id)
    ).one_or_none()
    return BootOf(*row) if row is not None else None


def peer_boots(
    session: Session, provider: str, gpu: str | None, now: datetime, leaving_out: str
) -> list[float]:
    """Seconds of the cold boots of (provider, GPU) a new boot is judged against: `boot_stats`'
    samples (the newest BOOT_STATS_SAMPLES within BOOT_STATS_WINDOW), `leaving_out` left out.
    One query."""
    same_gpu = Instance.gpu.is_(None) if gpu is None else Instance.gpu == gpu
    earlier = cold_boots(
        session,
        now - BOOT_STATS_WINDOW,
        per=[("provider", "gpu")],
        latest=BOOT_STATS_SAMPLES,
        where=[Instance.provider == provider, same_gpu, Instance.launch_id != leaving_out],
    )
    return [b.seconds for b in earlier]


@dataclass(frozen=True)
class BootTimeView:
    """Cold boots of one (provider, GPU) — of one queue where `queue` is set — over the last
    `BOOT_STATS_WINDOW`: median and p90 seconds from the launch decision to ready (the
    control plane's own times) and how many boots. `gpu` is "" where it is unknown."""

    provider: str
    gpu: str
    median_seconds: float
    p90_seconds: float
    samples: int
    queue: str | None = None

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "provider": self.provider,
            "gpu": self.gpu,
            "median_seconds": round(self.median_seconds, 3),
            "p90_seconds": round(self.p90_seconds, 3),
            "samples": self.samples,
        }
        if self.queue is not None:
            data["queue"] = self.queue
        return data


def boot_times(session: Session, now: datetime, *, queue: str | None = None) -> list[BootTimeView]:
    """Boot times per (provider, GPU), or per (provider, GPU) for `queue`'s machines alone,
    sorted by provider and GPU (`boot_stats`), as `status`, the dashboard and /metrics show
    them. One query."""
    by_key, by_queue = boot_tables(session, now)
    if queue is None:
        return [
            BootTimeView(p, g, st.median, st.p90, st.samples)
            for (p, g), st in sorted(by_key.items())
        ]
    return [
        BootTimeView(p, g, st.median, st.p90, st.samples, queue=q)
        for (q, p, g), st in sorted(by_queue.items())
        if q == queue
    ]


__all__ = [
    "BOOT_HISTORY",
    "BOOT_STATS_SAMPLES",
    "BOOT_STATS_WINDOW",
    "BootOf",
    "BootTimeView",
    "ColdBoot",
    "boot_estimates",
    "boot_of",
    "boot_stats",
    "boot_stats_by_queue",
    "boot_tables",
    "boot_times",
    "cold_boots",
    "peer_boots",
    "placement_boot_times",
]

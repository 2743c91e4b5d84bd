"""The demo's summary, read from the state store and the jobs' own records, and what a
runqy-like policy would have rented on the same burst (the simulator, same boot time)."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from autoscaler.demo.app import QUEUE, Published
from autoscaler.sim.report import percentile
from autoscaler.store.db import make_engine, session_factory, transaction
from autoscaler.store.models import Instance


@dataclass(frozen=True)
class RentedMachine:
    launch_id: str
    state: str
    created_at: datetime
    ended_at: datetime | None
    ready_at: datetime | None

    def seconds(self, now: datetime) -> float:
        """Billed from the rental decision's row to its end (destroyed, failed or lost)."""
        return max(0.0, ((self.ended_at or now) - self.created_at).total_seconds())


def machines(database_url: str) -> list[RentedMachine]:
    engine = make_engine(database_url)
    try:
        with transaction(session_factory(engine)) as session:
            rows = session.scalars(
                select(Instance).where(Instance.queue == QUEUE).order_by(Instance.id)
            ).all()
            return [
                RentedMachine(
                    r.launch_id,
                    r.state.value,
                    r.created_at,
                    r.terminated_at or r.failed_at or r.lost_at,
                    r.ready_at,
                )
                for r in rows
            ]
    finally:
        engine.dispose()


@dataclass(frozen=True)
class Policy:
    name: str
    machines: int
    machine_seconds: float
    wait_p50: float
    wait_p95: float


@dataclass(frozen=True)
class Summary:
    published: int
    ran: int
    runs_per_job: dict[str, int]
    wait_p50: float
    wait_p95: float
    wait_max: float
    machines: int
    machine_seconds: float
    peak: int
    boot_s: float
    price_per_hour: float
    elapsed_s: float
    runqy: Policy | None
    ours_simulated: Policy | None

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "dollars": self.dollars, "every_job_once": self.every_job_once}

    @property
    def dollars(self) -> float:
        return self.machine_seconds / 3600.0 * self.price_per_hour

    @property
    def every_job_once(self) -> bool:
        return self.ran == self.published and all(n == 1 for n in self.runs_per_job.values())

    def lines(self) -> list[str]:
        out = [
            f"jobs: {self.published} published, {self.ran} run"
            + (" (each exactly once)" if self.every_job_once else f" (runs: {self.runs_per_job})"),
            f"waits (publish to start): p50 {self.wait_p50:.1f} s, p95 {self.wait_p95:.1f} s, "
            f"max {self.wait_max:.1f} s",
            f"machines: {self.machines} rented (at most {self.peak} at once), "
            f"{self.machine_seconds:.0f} machine-seconds "
            f"(${self.dollars:.4f} at a pretend ${self.price_per_hour:.2f}/h); "
            f"boot to first job {self.boot_s:.1f} s (median)",
        ]
        for p, what in ((self.runqy, "runqy-like policy"), (self.ours_simulated, "our policy")):
            if p is None:
                continue
            out.append(
                f"{what}, simulated on this burst (same boot time): {p.machines} machine(s), "
                f"{p.machine_seconds:.0f} machine-seconds, waits p50 {p.wait_p50:.1f} s, "
                f"p95 {p.wait_p95:.1f} s"
            )
        out.append(f"demo ran {self.elapsed_s:.0f} s")
        return out


def peak(ms: list[RentedMachine], now: datetime) -> int:
    points = sorted(
        [(m.created_at, 1) for m in ms] + [(m.ended_at or now, -1) for m in ms],
        key=lambda p: (p[0], p[1]),
    )
    n = top = 0
    for _, d in points:
        n += d
        top = max(top, n)
    return top


def summarize(
    database_url: str,
    published: list[Published],
    records: list[dict[str, Any]],
    config: dict[str, Any],
    price_per_hour: float,
    started: float,
    now: datetime | None = None,
) -> Summary:
    now = now or datetime.now(UTC)
    ms = machines(database_url)
    starts: dict[str, float] = {}
    ends: Counter[str] = Counter()
    runtimes: dict[str, float] = {}
    first_job_on: dict[str, float] = {}
    for e in sorted(records, key=lambda e: float(e.get("at") or 0.0)):
        job, at = str(e.get("job")), float(e.get("at") or 0.0)
        if e.get("phase") == "start":
            starts.setdefault(job, at)
            label = str(e.get("worker") or "").rsplit("@", 1)[0]
            first_job_on.setdefault(label, at)
        elif e.get("phase") == "end":
            ends[job] += 1
            if job in starts:
                runtimes.setdefault(job, at - starts[job])
    at_of = {p.job: p.at for p in published}
    waits = sorted(max(0.0, starts[j] - at_of[j]) for j in at_of if j in starts)
    boots = []
    for m in ms:
        first = next((t for label, t in first_job_on.items() if label.endswith(m.launch_id)), None)
        if first is not None:
            boots.append(first - m.created_at.timestamp())
    boot = statistics.median(boots) if boots else 10.0
    t0 = min((p.at for p in published), default=started)
    from autoscaler.sim.trace import Job

    trace = [
        Job(p.at - t0, max(0.1, runtimes.get(p.job, p.seconds)))
        for p in sorted(published, key=lambda p: p.at)
    ]
    return Summary(
        published=len(published),
        ran=sum(1 for p in published if ends[p.job] > 0),
        runs_per_job={p.job: ends[p.job] for p in published},
        wait_p50=percentile(waits, 50),
        wait_p95=percentile(waits, 95),
        wait_max=waits[-1] if waits else 0.0,
        machines=len(ms),
        machine_seconds=sum(m.seconds(now) for m in ms),
        peak=peak(ms, now),
        boot_s=boot,
        price_per_hour=price_per_hour,
        elapsed_s=now.timestamp() - started,
        runqy=simulate(config, trace, boot, price_per_hour, "runqy"),
        ours_simulated=simulate(config, trace, boot, price_per_hour, "ours"),
    )


def simulate(
    config: dict[str, Any], trace: list[Any], boot_s: float, price: float, policy: str
) -> Policy | None:
    """The same queue, its machines simulated with the boot time measured here."""
    if not trace:
        return None
    import yaml

    from autoscaler.config import load_config_text
    from autoscaler.policy.decide import decide
    from autoscaler.sim.baselines import Runqy
    from autoscaler.sim.engine import Simulation
    from autoscaler.sim.report import summarize as sim_summarize

    queue = dict(config["queues"][QUEUE])
    auto = dict(queue["autoscale"], provider="sim")
    sim_config = {
        **{k: v for k, v in config.items() if k not in ("providers", "queues")},
        "providers": {
            "sim": {"kind": "mock", "boot_delay": round(boot_s, 1), "price_per_hour": price}
        },
        "queues": {QUEUE: {"metrics": queue["metrics"], "autoscale": auto}},
    }
    loaded = load_config_text(
        yaml.safe_dump(sim_config), "demo-sim", registered_providers={}, runnable=True
    )
    last = max(j.arrival_s for j in trace)
    sim = Simulation(
        loaded,
        QUEUE,
        trace,
        Runqy() if policy == "runqy" else decide,
        name=policy,
        day_s=last + 1.0,
        tail_s=3600.0,
    )
    r = sim_summarize(sim.run())
    return Policy(policy, r.launches, r.machine_hours * 3600.0, r.wait_p50, r.wait_p95)
